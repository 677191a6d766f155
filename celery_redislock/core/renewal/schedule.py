"""The renewer's decisions, with no I/O and no threads: which leases to renew when,
what a reply means for each, when a lease is lost.

One :class:`Schedule` is driven by the sync renewer (a scheduler thread, under its
lock, see :mod:`.scheduler`) and by each event loop's async renewer
(``celery_redislock.asyncio.renewal``), so the two apply the same tick, batch and loss
rules (see the package's docstring) and cannot drift apart. Leases wait in a heap
ordered by the time they are due (see :mod:`.entry` for its items).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

from ..lease_state import LeaseState, retry_after
from .entry import (
    NOT_HELD,
    Entry,
    HeapItem,
    Reply,
    current,
    loss_reason,
    pop_superseded,
    restart_grace_ms,
)

__all__ = ["DUE", "EARLY", "LATE", "Lost", "Schedule"]

DUE = 1 / 3
"""Renew when this fraction of the TTL has passed since the last send ..."""

EARLY = 1 / 6
"""... and take along every lease at least this far into its TTL."""


LATE = 2.0
"""Seconds a renewal may come after it is due when Redis was down: a failed call is
tried again within ``lease_state.retry_after`` (at most 1 s), redis-py's own retries
wait up to 1 s between tries, plus a loaded scheduler's delay (measured: holders put back ~1 s after
a restarted Redis answered, benchmarks/bench_restart_grace.py; #29 item 4)."""


def period(entry: Entry, ttl: float) -> float:
    """The span ``ttl`` s leases are renewed on (DUE, EARLY of it): the TTL, or shorter
    when the holder's restart grace (see ``core/restart.py``) would not cover a
    renewal DUE into it plus :data:`LATE` -- after Redis lost its data, a lease is put
    back only by a renewal within the grace, whatever its own TTL. A grace shorter
    than that margin allows renews every grace * DUE."""
    grace = restart_grace_ms(entry.holder) / 1000.0
    if not grace:
        return ttl
    return min(ttl, max(grace, (grace - LATE) / DUE))


Lost = list[tuple[LeaseState, str]]
"""Leases found lost, with the reason: report them (``entry.report``) outside any lock."""


class Schedule:
    """The heap of leases being renewed and the rules that move them.

    ``wake()`` is called when a push is due before :attr:`wake_at`, the time the
    driver, asleep, wakes by itself (``inf`` while it is awake: it reads the heap again
    before it sleeps); a push due no later needs no wake-up.
    """

    __slots__ = ("_seq", "_wake", "heap", "live", "wake_at")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.heap: list[HeapItem] = []
        self._seq = itertools.count(1)
        self.live = 0
        self.wake_at = math.inf
        self._wake = wake

    def add(self, entry: Entry, lease: LeaseState) -> None:
        """Track ``entry`` (of ``lease``, granted ``lease.ttl`` before its deadline)."""
        granted = lease.deadline - lease.ttl
        self.live += 1
        if entry.stop_at is not None and lease.deadline >= entry.stop_at - 0.001:
            entry.final = True
            self.push(entry, lease.deadline, lease.deadline)
        else:
            self.push_renewal(entry, granted, lease.ttl)
        if len(self.heap) > 2 * self.live + 1024:
            self.heap = [item for item in self.heap if current(item)]
            heapq.heapify(self.heap)

    def drop(self, entry: Entry) -> None:
        """Stop tracking ``entry`` (released, lost or collected)."""
        if not entry.dead:
            entry.dead = True
            self.live -= 1

    def push(self, entry: Entry, due: float, early: float) -> None:
        """Make ``(due, early)`` the entry's one current heap item."""
        entry.ticket = next(self._seq)
        heapq.heappush(self.heap, (due, entry.ticket, early, entry))
        if due < self.wake_at:
            self._wake()

    def push_renewal(self, entry: Entry, start: float, ttl: float) -> None:
        """Renew the entry DUE into its period (see :func:`period`) from ``start``,
        taking it along from EARLY."""
        span = period(entry, ttl)
        self.push(entry, start + span * DUE, start + span * EARLY)

    def next_due(self) -> float | None:
        """When the driver must look again (None: nothing tracked; the heap is cleared)."""
        if self.live and self.heap:
            return self.heap[0][0]  # never superseded: collect popped those
        self.heap.clear()
        return None

    def collect(self, now: float, lost: Lost) -> list[tuple[Entry, int]]:
        """If a lease is due by ``now``, pop it and every lease early enough to join;
        returns the renewals to send, ``(entry, ttl_ms)``, and adds losses to ``lost``."""
        ready: list[tuple[Entry, int]] = []
        heap = self.heap
        pop_superseded(heap)  # they must neither wake us nor start a tick
        if not heap or heap[0][0] > now:
            return ready
        while heap and heap[0][2] <= now:
            entry = heapq.heappop(heap)[3]
            pop_superseded(heap)
            lease = entry.lease()
            if lease is None or lease._lost or lease.released:
                self.drop(entry)
                continue
            deadline = lease.deadline
            if now >= deadline:
                self.drop(entry)
                lost.append((lease, loss_reason(entry)))
                continue
            ttl = lease.ttl if entry.stop_at is None else min(lease.ttl, entry.stop_at - now)
            if ttl < 0.001:
                entry.final = True
            if not (entry.inflight or entry.final):
                entry.inflight = True
                entry.gen = lease._gen  # read with the TTL: sent together
                ready.append((entry, max(1, int(ttl * 1000))))
            self.push(entry, deadline, deadline)  # the loss check, unless confirmed
        return ready

    def explicit(self, entry: Entry, lease: LeaseState, ttl: float) -> int:
        """An explicit TTL change of ``lease`` to ``ttl`` s is about to be sent: its
        next generation (renewals composed before it are ignored by Redis), and the
        TTL renewals use from now on."""
        lease._gen += 1
        lease.ttl = ttl
        return lease._gen

    def rescheduled(self, entry: Entry, sent_at: float, ttl: float) -> None:
        """An explicit change sent at ``sent_at`` set the lease to ``ttl`` s: renew it
        on that TTL's schedule (not the old one, which may come after it expired)."""
        if not entry.dead and not entry.final:
            self.push_renewal(entry, sent_at, ttl)

    def answered(
        self, replies: list[Reply], sent_at: float, error: str, now: float, lost: Lost
    ) -> None:
        """Record one call's outcome (``error`` non-empty: the call failed), sent at
        ``sent_at`` and answered at ``now``; adds losses to ``lost``."""
        for entry, ttl_ms, renewed in replies:
            entry.inflight = False
            entry.error = error
            lease = entry.lease()
            if entry.dead or lease is None or lease.released:
                self.drop(entry)
            elif renewed is None:
                pass  # superseded by an explicit extend, which set the TTL and the schedule
            elif not error and not renewed:
                self.drop(entry)
                lost.append((lease, NOT_HELD))
            elif now >= lease.deadline:
                self.drop(entry)
                lost.append((lease, loss_reason(entry)))
            elif error:
                retry = min(now + retry_after(lease.ttl), lease.deadline)
                self.push(entry, retry, retry)
            else:
                ttl = ttl_ms / 1000.0
                lease._confirm(sent_at + ttl)
                if entry.stop_at is not None and sent_at + ttl >= entry.stop_at - 0.001:
                    entry.final = True
                    self.push(entry, lease.deadline, lease.deadline)
                else:
                    self.push_renewal(entry, sent_at, ttl)
