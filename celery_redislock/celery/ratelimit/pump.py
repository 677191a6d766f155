"""The pump: a thread in each worker's main process that starts parked rate-limited
runs at their admission times.

Capacity of a rate limiter is freed by time, not by a release, so no release hands it
on (as one does a permit). The pump does: for every limiter with parked runs
(``<prefix>:parking:rate:pools``, see :func:`~celery_redislock.core.parking.pools_key`)
it pumps the queue -- one script call that claims and charges as many runs from the
queue's head as the limiter admits now, which the pump publishes at once, and answers
when the next one is admitted (the server's clock: a penalty and an override
included) -- and sleeps until the earliest of them (at most :data:`IDLE` seconds, so a
run parked by another process is seen soon; at once when a run is parked at this
worker's intake, :func:`poke`). Several workers' pumps at once are harmless: each
claim is one atomic script, so every run is claimed once. What the pump misses (its
worker gone) the others do; lapsed claims come back to the queue on the next pump.

May import the core, the shared glue and the bounded feature's parking.
"""

from __future__ import annotations

import logging
from typing import Final

from celery import Celery, signals

from ...core.parking import parking_pools
from ..background import AppThread, PerApp
from ..client import get_redis
from ..config import settings_for
from ..outage import OUTAGE_ERRORS, has_answered

__all__ = ["IDLE", "PUMPS", "RatePump", "connect", "poke", "pump_once"]

logger = logging.getLogger(__name__)

IDLE: Final = 0.25
"""Seconds the pump sleeps at most (no admission time known: no parked run seen)."""

_LEAST: Final = 0.001
"""Seconds the pump sleeps at least while runs are parked (no busy loop when the next
admission is within AHEAD but a pump claimed nothing: it is taken meanwhile)."""


def pump_once(app: Celery, skipped: dict[str, str] | None = None) -> float:
    """Pump every rate-limited pool with parked runs once; the seconds until the next
    admission of any of them (:data:`IDLE` when none is parked).

    A pool that cannot be pumped (its stored ``rates`` corrupted, a limiter written by
    another version) is skipped and the others pumped all the same: pools come back
    sorted, so ending the round at a bad one starved every pool after it in every
    worker, for good. ``skipped`` (pool -> cause, kept by the caller across rounds)
    says a pool once at WARNING per cause, then at DEBUG; a pool that pumps again, or
    has left the set, is forgotten. An unreachable Redis (``OUTAGE_ERRORS``) still
    ends the round: no pool can be pumped then, and the caller says so once."""
    from .queues import AHEAD, RATE, attached_queue

    client = get_redis(app)
    nearest = IDLE
    skipped = {} if skipped is None else skipped
    pools = parking_pools(client, settings_for(app).prefix, RATE)
    for gone in skipped.keys() - set(pools):
        del skipped[gone]
    for pool in pools:
        try:
            attached = attached_queue(app, pool)
            if attached is None:
                continue
            queue, _ = attached
            # The next admission comes with the claims (one script call a pool, #25: a
            # retry_after() after each pump was a fourth of the pump's round trips).
            _, _, wait = queue.pump_until()
        except OUTAGE_ERRORS:
            raise
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            logger.log(
                logging.DEBUG if skipped.get(pool) == cause else logging.WARNING,
                "celery_redislock: rate limiter %r cannot be pumped (%s); its parked runs "
                "wait, the other limiters' are pumped",
                pool,
                cause,
            )
            skipped[pool] = cause
            continue
        skipped.pop(pool, None)
        if wait is not None:  # claimed AHEAD of the admission time (see queues.AHEAD)
            nearest = min(nearest, max(wait - AHEAD, _LEAST))
    return max(nearest, 0.0)


class RatePump(AppThread):
    """Calls :func:`pump_once` until :meth:`stop`, sleeping until the next admission."""

    def __init__(self, app: Celery) -> None:
        super().__init__(app, "celery_redislock-rate-pump")
        self._skipped: dict[str, str] = {}  # pools pump_once could not pump: logged once

    def run(self) -> None:
        failing = quiet = False
        while not self.stopping:
            try:
                wait = pump_once(self.app, self._skipped)
            except OUTAGE_ERRORS as exc:
                if not failing:
                    # A lock Redis that never answered is a wrong redislock_url, which
                    # the worker's start says once (outage.py); not an outage to repeat.
                    quiet = not has_answered(self.app)
                    logger.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "celery_redislock: parked rate-limited runs cannot be pumped (%s: %s); "
                        "tried again every %.2fs",
                        type(exc).__name__,
                        exc,
                        IDLE,
                    )
                failing, wait = True, IDLE
            except Exception:
                logger.exception("celery_redislock: the rate pump failed; tried again")
                wait = IDLE
            else:
                if failing and not quiet:
                    logger.info("celery_redislock: pumping parked rate-limited runs again")
                failing = False
            self.sleep(wait)


def _pump_for(app: Celery) -> RatePump | None:
    rate_limited = any(
        getattr(task, "global_rate_limit", None) is not None for task in list(app.tasks.values())
    )
    return RatePump(app) if rate_limited else None


PUMPS: Final = PerApp("rate.pump", _pump_for)
"""This process's pump of each app."""


def poke(app: Celery) -> None:
    """Ask this process's pump of ``app`` (if any) to pump now."""
    PUMPS.poke(app)


def connect() -> None:
    """Start a pump in each worker's main process (idempotent): at ``worker_init``,
    which in-process workers (``start_worker``) send too, unlike ``worker_ready``;
    before the pool's processes are forked, which do not inherit the thread."""
    PUMPS.connect(signals.worker_init)
