"""The renewer's scheduler: one thread that decides which leases to renew, and when.

Leases wait in a heap ordered by the time they are due; see the package's docstring
for the tick, batching and loss rules. The scheduler never talks to Redis itself: it hands
each tick's batch to the client's :class:`~.sender.Sender` and wakes at every
lease's local deadline, so a Redis that does not answer cannot delay a loss report.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time

from ..lease import Lease
from .entry import (
    NOT_HELD,
    Entry,
    HeapItem,
    Renewable,
    Reply,
    current,
    loss_reason,
    pop_superseded,
    report,
)
from .sender import MAX_BATCH, Sender

__all__ = ["IDLE_EXIT", "MAX_BATCH", "Renewer"]

IDLE_EXIT = 10.0
"""Seconds a renewal thread lingers with nothing to do before it exits."""

_DUE = 1 / 3  # renew when this fraction of the TTL has passed since the last send ...
_EARLY = 1 / 6  # ... and take along every lease at least this far into its TTL


class Renewer:
    """The process's lease renewer (see :mod:`.renewal`); use ``renewal.renewer()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[HeapItem] = []
        self._seq = itertools.count(1)
        self._live = 0
        self._thread: threading.Thread | None = None
        self._senders: dict[int, Sender] = {}
        # When the scheduler thread, asleep, wakes by itself (inf while it is awake:
        # it reads the heap again before it sleeps). A push due no earlier needs no
        # notify: waking the thread for nothing costs the caller a GIL hand-off per
        # lease, on every task start.
        self._wake_at = math.inf

    @property
    def tracked(self) -> int:
        """How many leases are being renewed (or watched until their deadline)."""
        return self._live

    def add(self, lease: Lease, holder: Renewable, max_hold: float | None) -> Entry:
        """Start renewing ``lease``; returns its entry, whose ``stop()`` ends renewal."""
        granted = lease.deadline - lease.ttl
        entry = Entry(lease, holder, self._stop, None if max_hold is None else granted + max_hold)
        with self._lock:
            self._live += 1
            if entry.stop_at is not None and lease.deadline >= entry.stop_at - 0.001:
                entry.final = True
                self._push(entry, lease.deadline, lease.deadline)
            else:
                self._push(entry, granted + lease.ttl * _DUE, granted + lease.ttl * _EARLY)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-redislock-renewer", daemon=True
                )
                self._thread.start()
            elif len(self._heap) > 2 * self._live + 1024:
                self._heap = [item for item in self._heap if current(item)]
                heapq.heapify(self._heap)
        return entry

    def _stop(self, entry: Entry) -> None:
        with self._lock:
            self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        if not entry.dead:
            entry.dead = True
            self._live -= 1

    def _push(self, entry: Entry, due: float, early: float) -> None:
        entry.ticket = next(self._seq)
        item = (due, entry.ticket, early, entry)
        heapq.heappush(self._heap, item)
        if due < self._wake_at:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            lost: list[tuple[Lease, str]] = []
            with self._lock:
                ready = self._collect(time.monotonic(), lost)
                for entry, ttl_ms in ready:
                    self._sender(entry).submit(entry, ttl_ms)
                if not ready and not lost and not self._sleep():
                    return
            report(lost)

    def _sleep(self) -> bool:
        """Wait for the next due time; False when the thread should exit (idle)."""
        if self._live and self._heap:
            due = self._heap[0][0]  # never superseded: _collect popped those
            self._wake_at = due
            self._cond.wait(max(0.0, due - time.monotonic()))
            self._wake_at = math.inf
            return True
        self._heap.clear()
        self._wake_at = time.monotonic() + IDLE_EXIT
        notified = self._cond.wait(IDLE_EXIT)
        self._wake_at = math.inf
        if notified or self._live:
            return True
        self._thread = None
        return False

    def _collect(self, now: float, lost: list[tuple[Lease, str]]) -> list[tuple[Entry, int]]:
        """If a lease is due by ``now``, pop it and every lease early enough to join."""
        ready: list[tuple[Entry, int]] = []
        heap = self._heap
        pop_superseded(heap)  # they must neither wake us nor start a tick
        if not heap or heap[0][0] > now:
            return ready
        while heap and heap[0][2] <= now:
            entry = heapq.heappop(heap)[3]
            pop_superseded(heap)
            lease = entry.lease()
            if lease is None or lease._lost or lease.released:
                self._drop(entry)
                continue
            deadline = lease.deadline
            if now >= deadline:
                self._drop(entry)
                lost.append((lease, loss_reason(entry)))
                continue
            ttl = lease.ttl if entry.stop_at is None else min(lease.ttl, entry.stop_at - now)
            if ttl < 0.001:
                entry.final = True
            if not (entry.inflight or entry.final):
                entry.inflight = True
                ready.append((entry, max(1, int(ttl * 1000))))
            self._push(entry, deadline, deadline)  # the loss check, unless confirmed
        return ready

    def _sender(self, entry: Entry) -> Sender:
        sender = self._senders.get(id(entry.client))
        if sender is None:
            sender = self._senders[id(entry.client)] = Sender(
                entry.client, self._lock, self._on_replies, self._forget_sender
            )
        return sender

    def _forget_sender(self, sender: Sender) -> None:
        # Called by an idle sender thread, under the lock, as it exits.
        if self._senders.get(id(sender.client)) is sender:
            del self._senders[id(sender.client)]

    def _on_replies(self, replies: list[Reply], sent_at: float, error: str) -> None:
        """Record one call's outcome (``error`` non-empty: the call failed)."""
        lost: list[tuple[Lease, str]] = []
        with self._lock:
            now = time.monotonic()
            for entry, ttl_ms, renewed in replies:
                entry.inflight = False
                entry.error = error
                lease = entry.lease()
                if entry.dead or lease is None or lease.released:
                    self._drop(entry)
                elif not error and not renewed:
                    self._drop(entry)
                    lost.append((lease, NOT_HELD))
                elif now >= lease.deadline:
                    self._drop(entry)
                    lost.append((lease, loss_reason(entry)))
                elif error:
                    retry = min(now + max(0.02, min(lease.ttl * _EARLY, 1.0)), lease.deadline)
                    self._push(entry, retry, retry)
                else:
                    ttl = ttl_ms / 1000.0
                    lease._confirm(sent_at + ttl)
                    if entry.stop_at is not None and sent_at + ttl >= entry.stop_at - 0.001:
                        entry.final = True
                        self._push(entry, lease.deadline, lease.deadline)
                    else:
                        self._push(entry, sent_at + ttl * _DUE, sent_at + ttl * _EARLY)
        report(lost)
