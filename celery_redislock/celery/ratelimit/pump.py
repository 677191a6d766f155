"""The pump: a thread in each worker's main process that starts parked rate-limited
runs at their admission times.

Capacity of a rate limiter is freed by time, not by a release, so no release hands it
on (as one does a permit). The pump does: for every limiter with parked runs
(``<prefix>:parking:rate:pools``, see :func:`~celery_redislock.core.parking.pools_key`)
it pumps the queue -- one script call that claims and charges as many runs from the
queue's head as the limiter admits now, which the pump publishes at once -- then asks
when the next one is admitted (the server's clock: a penalty and an override
included) and sleeps until the earliest of them (at most :data:`IDLE` seconds, so a
run parked by another process is seen soon; at once when a run is parked at this
worker's intake, :func:`poke`). Several workers' pumps at once are harmless: each
claim is one atomic script, so every run is claimed once. What the pump misses (its
worker gone) the others do; lapsed claims come back to the queue on the next pump.

May import the core, the shared glue and the bounded feature's parking.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from celery import signals

from ...core.parking import parking_pools
from ..client import get_redis
from ..config import settings_for
from ..outage import OUTAGE_ERRORS

__all__ = ["IDLE", "RatePump", "connect", "poke", "pump_once"]

logger = logging.getLogger(__name__)

IDLE: Final = 0.25
"""Seconds the pump sleeps at most (no admission time known: no parked run seen)."""

_LEAST: Final = 0.001
"""Seconds the pump sleeps at least while runs are parked (no busy loop when the next
admission is within AHEAD but a pump claimed nothing: it is taken meanwhile)."""

_pumps: dict[int, RatePump] = {}
_pumps_guard = threading.Lock()


def pump_once(app: Any) -> float:
    """Pump every rate-limited pool with parked runs once; the seconds until the next
    admission of any of them (:data:`IDLE` when none is parked)."""
    from .queues import AHEAD, RATE, attached_queue

    client = get_redis(app)
    nearest = IDLE
    for pool in parking_pools(client, settings_for(app).prefix, RATE):
        attached = attached_queue(app, pool)
        if attached is None:
            continue
        queue, limiter = attached
        parked, _ = queue.pump()
        if parked:  # claimed AHEAD of the admission time (see queues.AHEAD)
            nearest = min(nearest, max(limiter.retry_after() - AHEAD, _LEAST))
    return max(nearest, 0.0)


class RatePump(threading.Thread):
    """Calls :func:`pump_once` until :meth:`stop`, sleeping until the next admission."""

    def __init__(self, app: Any) -> None:
        super().__init__(name="celery_redislock-rate-pump", daemon=True)
        self.app = app
        self._stop_event, self._poked = threading.Event(), threading.Event()

    def run(self) -> None:
        failing = False
        while not self._stop_event.is_set():
            try:
                wait = pump_once(self.app)
            except OUTAGE_ERRORS as exc:
                if not failing:
                    logger.warning(
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
                if failing:
                    logger.info("celery_redislock: pumping parked rate-limited runs again")
                failing = False
            if wait > 0:
                self._poked.wait(wait)
            self._poked.clear()

    def poke(self) -> None:
        """Pump now (a run was parked here)."""
        self._poked.set()

    def stop(self) -> None:
        """Stop after the current pump."""
        self._stop_event.set()
        self._poked.set()


def _rate_limited(app: Any) -> bool:
    return any(
        getattr(task, "global_rate_limit", None) is not None for task in list(app.tasks.values())
    )


def _on_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or not _rate_limited(app):
        return
    with _pumps_guard:
        if id(app) in _pumps:
            return
        pump = _pumps[id(app)] = RatePump(app)
    pump.start()


def _on_shutdown(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    with _pumps_guard:
        pump = _pumps.pop(id(app), None)
    if pump is not None:
        pump.stop()
        pump.join(timeout=5)


def poke(app: Any) -> None:
    """Ask this process's pump of ``app`` (if any) to pump now."""
    pump = _pumps.get(id(app))
    if pump is not None:
        pump.poke()


def connect() -> None:
    """Start a pump in each worker's main process (idempotent): at ``worker_init``,
    which in-process workers (``start_worker``) send too, unlike ``worker_ready``;
    before the pool's processes are forked, which do not inherit the thread."""
    signals.worker_init.connect(_on_init, weak=False, dispatch_uid="celery_redislock.rate.init")
    signals.worker_shutdown.connect(
        _on_shutdown, weak=False, dispatch_uid="celery_redislock.rate.shutdown"
    )
