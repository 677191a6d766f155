"""The sweeper: a thread in each worker's main process that keeps parked runs moving.

Releases hand permits to parked runs as they happen; the sweeper covers what no
release sees, every ``redislock_park_sweep_interval`` seconds (1 s) and at once when
the main process gave back a dead child's permit (:func:`poke`):

* a permit that came back by expiry (a whole host lost) or by the main process's
  cleanup goes to the oldest parked run;
* a claimed run whose permit reservation lapsed -- its publisher died before
  publishing, the broker refused the message, or the message was lost and never
  started -- goes back to its old place and is claimed (published) again;
* an outage: while the lock Redis or the broker is down nothing moves; when they are
  back the next sweep catches up (one WARNING when it starts failing, one INFO when
  it works again);
* a lock Redis that lost its data: the runs parked there are parked again from the
  park journal (:mod:`.recovery`; a WARNING says so); without a journal (broker and
  lock Redis are one server, or a non-Redis broker) they are gone (their messages were
  acknowledged) and an ERROR says so, with how many this worker saw at its last sweep.

It looks at the pools with parked runs of every kind of capacity (parking adds its
pool to the kind's set, ``<prefix>:parking:pools`` for semaphores, see
:func:`~celery_redislock.core.parking.pools_key`), one script call per pool. Several
workers sweeping at once are harmless: every step is one atomic script.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Final

from celery import Celery, signals

from ...core.keys import DEFAULT_PREFIX, encode_name
from ...core.parking import ParkingQueue, parking_pools, pools_key
from ...core.scripts import RedisClient, as_text
from ...errors import ConfigurationError
from ..background import AppThread, PerApp
from ..client import get_redis
from ..config import settings_for
from ..outage import OUTAGE_ERRORS, has_answered
from .journal import ParkSpec
from .parking import kinds, queue_for
from .recovery import recover
from .settings import DEFAULT_SWEEP_INTERVAL, sweep_interval

__all__ = ["DEFAULT_INTERVAL", "SWEEPERS", "Sweeper", "connect", "epoch", "poke", "sweep"]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL: Final = DEFAULT_SWEEP_INTERVAL
"""Seconds between sweeps (``redislock_park_sweep_interval``)."""


def sweep(app: Celery, unsure: set[tuple[str, str]] | None = None) -> tuple[int, int]:
    """One sweep of every pool with parked runs: ``(runs claimed and published, runs
    still parked or claimed)``.

    ``unsure`` (kind, pool), kept by the caller across sweeps: pools whose drop from
    the set of parked pools failed midway (see :func:`_drop`); each is added back
    before the set is read, so it is swept again."""
    client = get_redis(app)
    prefix = settings_for(app).prefix  # checked: the prefix runs' keys were made with
    unsure = set() if unsure is None else unsure
    for kind, pool in sorted(unsure):
        client.sadd(pools_key(prefix, kind), encode_name(pool))
        unsure.discard((kind, pool))
    published = waiting = 0
    for kind in kinds():
        pools = pools_key(prefix, kind)
        for pool in parking_pools(client, prefix, kind):
            # No terms: those stored with the pool apply (a semaphore's limit).
            try:
                queue = queue_for(app, ParkSpec(kind, pool, prefix, ()))
            except ConfigurationError as exc:  # a rate limiter whose state is gone
                logger.debug("celery_redislock: %s pool %r not swept (%s)", kind, pool, exc)
                client.srem(pools, encode_name(pool))
                continue
            # The pool leaves the set only once its queue is found empty: one whose
            # pump fails (a stalled or cut connection) stays, for the next sweep and
            # the rate pumps -- dropped before the pump, it was forgotten with its
            # parked runs.
            parked, claimed = queue.pump()
            published += len(claimed)
            left = parked + queue.parking_info().claimed
            if not left:
                try:
                    left = _drop(client, pools, queue)
                except Exception:
                    unsure.add((kind, pool))
                    with contextlib.suppress(Exception):  # at once if it can; else next time
                        client.sadd(pools, encode_name(pool))
                    raise
            waiting += left
    return published, waiting


def _drop(client: RedisClient, pools: str, queue: ParkingQueue) -> int:
    """Drop ``queue``'s pool, found empty, from the set ``pools``: the runs found
    parked or claimed after all (then it is added back).

    Looked at again after the drop: a run parked between the pump and the drop added
    the pool to the set before the drop took it out (a park adds it only when the
    queue was empty), so only this look sees it; one parked after the drop adds the
    pool itself. Not one script: in a cluster the set and the queue are in different
    slots. So should the drop or the look fail (a stalled connection: the drop may
    even land later), the caller adds the pool back -- it is not known to be empty."""
    name = encode_name(queue.capacity.name)
    client.srem(pools, name)
    info = queue.parking_info()
    left = info.parked + info.claimed
    if left:
        client.sadd(pools, name)
    return left


def epoch(app: Celery) -> str:
    """A random mark the lock Redis keeps (``<prefix>:parking:epoch``, set once): a
    new value means it lost its data (restarted empty, flushed, failed over to a
    replica without it)."""
    client = get_redis(app)
    key = f"{app.conf.get('redislock_prefix') or DEFAULT_PREFIX}:parking:epoch"
    client.set(key, secrets.token_hex(8), nx=True)
    return as_text(client.get(key))


class Sweeper(AppThread):
    """Calls :func:`sweep` every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, app: Celery, interval: float) -> None:
        super().__init__(app, "celery_redislock-sweeper")
        self.interval = interval
        self._epoch: str | None = None
        self._journal_failing = False
        self._waiting = 0
        self._unsure: set[tuple[str, str]] = set()  # pools to add back (see sweep)

    def tick(self) -> None:
        """One sweep; first, when the lock Redis lost its data since the last one, its
        parked runs are parked again from the journal (or an ERROR says they are lost)."""
        mark = epoch(self.app)
        try:
            restored = recover(self.app, mark)
        except OUTAGE_ERRORS as exc:  # the journal's Redis is down: sweep all the same
            if not self._journal_failing:
                logger.warning(
                    "celery_redislock: the park journal cannot be read (%s: %s); "
                    "tried again at every sweep",
                    type(exc).__name__,
                    exc,
                )
            self._journal_failing = True
            restored, mark = 0, self._epoch or mark  # a new mark is seen again next time
        else:
            self._journal_failing = False
        if self._epoch is not None and mark != self._epoch:
            if restored is not None:
                logger.warning(
                    "celery_redislock: the lock Redis lost its data (restarted empty, "
                    "flushed or failed over without it): parked runs parked again from the "
                    "park journal (%d by this worker)",
                    restored,
                )
            else:
                logger.error(
                    "celery_redislock: the lock Redis lost its data (restarted empty, "
                    "flushed or failed over without it): the %d run(s) parked or claimed at "
                    "this worker's last sweep are lost; run it with persistence (appendonly "
                    "yes), or keep the broker on another Redis, to keep parked runs",
                    self._waiting,
                )
        elif restored:
            logger.info(
                "celery_redislock: the lock Redis restarted or failed over: %d "
                "journaled parked run(s) parked again (those it kept are unchanged)",
                restored,
            )
        self._epoch = mark
        _, self._waiting = sweep(self.app, self._unsure)

    def run(self) -> None:
        """Sweep until stopped; failures are logged once per outage, never raised."""
        failing = quiet = False
        while not self.stopping:
            try:
                self.tick()
            except Exception as exc:
                if not failing:
                    # A lock Redis that never answered is a wrong redislock_url, which
                    # the worker's start says once (outage.py); not an outage to repeat.
                    quiet = isinstance(exc, OUTAGE_ERRORS) and not has_answered(self.app)
                    logger.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "celery_redislock: parked runs cannot be swept (%s: %s); "
                        "retrying every %gs",
                        type(exc).__name__,
                        exc,
                        self.interval,
                    )
                failing = True
            else:
                if failing and not quiet:
                    logger.info("celery_redislock: sweeping parked runs again")
                failing = False
            self.sleep(self.interval)


def _sweeper_for(app: Celery) -> Sweeper | None:
    uses_parking = any(
        getattr(task, "concurrency_limit", None) is not None
        or getattr(task, "global_rate_limit", None) is not None
        for task in list(app.tasks.values())
    )
    return Sweeper(app, sweep_interval(app)) if uses_parking else None


SWEEPERS: Final = PerApp("sweeper", _sweeper_for)
"""This process's sweeper of each app."""


def poke(app: Celery) -> None:
    """Ask this process's sweeper of ``app`` (if any) to sweep now."""
    SWEEPERS.poke(app)


def connect() -> None:
    """Start a sweeper in each worker's main process (idempotent), at ``worker_ready``."""
    SWEEPERS.connect(signals.worker_ready)
