"""The leader lease of a beat group: one beat holds it; the others try for it.

The lease is a ``RedisLock`` (``beat:<group>``) acquired with ``renew=True``: the
core's renewer keeps it alive from its own thread, whatever the beat's ticks do, and
reports it lost -- Redis answered that it is gone, or no renewal was confirmed before
its local deadline (the beat was paused, cut off or Redis stalled). A lost lease
stops this beat's sends at once (:meth:`Leadership.leads` reads the lease's local
deadline, so a beat that wakes from a pause knows before its first send) and is
logged in one line.

Standbys try for the lease every ``poll`` seconds with a non-blocking acquire (a
queued blocking wait would leave a paused or cut-off standby first in the lock's
FIFO queue, holding up the next failover by the waiters' heartbeat period). A clean
shutdown releases the lease, so a standby takes over within one poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from ...core.lease import Lease
from ...core.lock import RedisLock
from ...errors import RedisLockError

__all__ = ["Leadership"]

log = logging.getLogger("celery_redislock.beat")


class Leadership:
    """This beat's side of the election; :meth:`start` runs it on a daemon thread."""

    def __init__(
        self,
        lock: RedisLock,
        owner: str,
        poll: float,
        on_elected: Callable[[Lease], None],
        on_lost: Callable[[Lease], None],
    ) -> None:
        self._lock = lock
        self.owner = owner
        self._poll = poll
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors = 0

    @property
    def lease(self) -> Lease | None:
        """The lease while this beat leads (it may be lost already: see :meth:`leads`)."""
        return self._lease

    def leads(self) -> bool:
        """True while this beat holds the leader lease, as far as it can know locally."""
        lease = self._lease
        return lease is not None and not lease.lost

    def start(self) -> None:
        """Start trying for the lease (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="redislock-beat-leader", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop trying and release the lease if held: a standby takes over at once."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        lease, self._lease = self._lease, None
        if lease is not None and not lease.lost:
            try:
                lease.release()
                log.info("beat: released the leader lease of %r", self._lock.name)
            except (RedisError, RedisLockError) as exc:
                log.warning("beat: could not release the leader lease (it expires): %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            lease = self._try()
            if lease is None:
                self._stop.wait(self._poll)
                continue
            if self._stop.is_set():  # stopped while acquiring: hand it back
                lease.release()
                return
            self._lease = lease
            self._on_elected(lease)
            # Sleep until lost or stopped; the renewer reports the loss (on_lost).
            while not self._stop.is_set() and not lease.lost:
                lease.lost_event.wait(self._poll)
            if lease.lost and self._lease is lease:
                self._lease = None

    def _try(self) -> Lease | None:
        try:
            lease, _holder = self._lock.try_acquire(
                owner=self.owner, renew=True, on_lost=self._lost
            )
        except (RedisError, RedisLockError) as exc:
            self._errors += 1
            if self._errors == 1 or self._errors % 100 == 0:  # one line per outage, not per poll
                log.warning("beat: cannot reach the lock Redis to lead: %s", exc)
            return None
        if self._errors:
            log.info("beat: the lock Redis answers again")
            self._errors = 0
        return lease

    def _lost(self, lease: Lease) -> None:
        # On the renewer's thread: keep it short.
        if not self._stop.is_set():
            self._on_lost(lease)
