"""The renewer's scheduler: one thread that decides which leases to renew, and when.

Leases wait in a heap ordered by the time they are due; see the package's docstring
for the tick, batching and loss rules. The scheduler never talks to Redis itself: it hands
each tick's batch to the client's :class:`~.sender.Sender` and wakes at every
lease's local deadline, so a Redis that does not answer cannot delay a loss report.
"""

from __future__ import annotations

import math
import threading
import time

from ..lease import Lease
from .entry import Entry, Renewable, RenewalClient, Reply, report
from .schedule import Lost, Schedule
from .sender import MAX_BATCH, Sender

__all__ = ["IDLE_EXIT", "MAX_BATCH", "Renewer"]

IDLE_EXIT = 10.0
"""Seconds a renewal thread lingers with nothing to do before it exits."""


class Renewer:
    """The process's lease renewer (see :mod:`.renewal`); use ``renewal.renewer()``.

    Its decisions are a :class:`~.schedule.Schedule`'s, taken under its lock; this
    class adds the scheduler thread, its sleep, and one sender per client.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Wakes the thread only for a push due before it wakes by itself: waking it
        # for nothing costs the caller a GIL hand-off per lease, on every task start.
        self._schedule = Schedule(lambda: self._cond.notify())
        self._thread: threading.Thread | None = None
        self._senders: dict[int, Sender] = {}

    @property
    def tracked(self) -> int:
        """How many leases are being renewed (or watched until their deadline)."""
        return self._schedule.live

    @property
    def _wake_at(self) -> float:
        return self._schedule.wake_at

    def add(self, lease: Lease, holder: Renewable, max_hold: float | None) -> Entry:
        """Start renewing ``lease``; returns its entry, whose ``stop()`` ends renewal."""
        granted = lease.deadline - lease.ttl
        entry = Entry(lease, holder, self._stop, None if max_hold is None else granted + max_hold)
        entry.renewer = self
        with self._lock:
            self._schedule.add(entry, lease)
            self._sender(entry).warm()  # if not yet: the path ready for the 1st renewal
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-redislock-renewer", daemon=True
                )
                self._thread.start()
        return entry

    def explicit(self, entry: Entry, ttl: float) -> int:
        """``entry``'s lease is about to be set to ``ttl`` s explicitly: its new
        generation (see :meth:`.schedule.Schedule.explicit`)."""
        lease = entry.lease()
        with self._lock:
            return 0 if lease is None else self._schedule.explicit(entry, lease, ttl)

    def rescheduled(self, entry: Entry, sent_at: float, ttl: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on its TTL."""
        with self._lock:
            self._schedule.rescheduled(entry, sent_at, ttl)

    def _stop(self, entry: Entry) -> None:
        with self._lock:
            self._schedule.drop(entry)

    def _run(self) -> None:
        schedule = self._schedule
        while True:
            lost: Lost = []
            with self._lock:
                ready = schedule.collect(time.monotonic(), lost)
                for entry, ttl_ms in ready:
                    self._sender(entry).submit(entry, ttl_ms)
                if not ready and not lost and not self._sleep():
                    return
            report(lost)

    def _sleep(self) -> bool:
        """Wait for the next due time; False when the thread should exit (idle)."""
        schedule = self._schedule
        due = schedule.next_due()
        if due is not None:
            schedule.wake_at = due
            self._cond.wait(max(0.0, due - time.monotonic()))
            schedule.wake_at = math.inf
            return True
        schedule.wake_at = time.monotonic() + IDLE_EXIT
        notified = self._cond.wait(IDLE_EXIT)
        schedule.wake_at = math.inf
        if notified or schedule.live:
            return True
        self._thread = None
        return False

    def prepare(self, client: RenewalClient) -> None:
        """A lease of ``client`` is about to be renewed (an acquire with renewal is
        being sent): open the renewer's connection to it now, in the background, so
        the first renewal does not pay for it."""
        with self._lock:
            self._sender_of(client).warm()

    def _sender(self, entry: Entry) -> Sender:
        return self._sender_of(entry.client)

    def _sender_of(self, client: RenewalClient) -> Sender:
        sender = self._senders.get(id(client))
        if sender is None:
            # A client may name its own kind of sender: a Redlock's masters renew by
            # majority (core/redlock/renewal.py); a Redis client gets the plain one.
            make: type[Sender] = getattr(client, "renewal_sender", Sender)
            sender = self._senders[id(client)] = make(
                client, self._lock, self._on_replies, self._forget_sender
            )
        return sender

    def _forget_sender(self, sender: Sender) -> None:
        # Called by an idle sender thread, under the lock, as it exits.
        if self._senders.get(id(sender.client)) is sender:
            del self._senders[id(sender.client)]

    def _on_replies(self, replies: list[Reply], sent_at: float, error: str) -> None:
        """Record one call's outcome (``error`` non-empty: the call failed)."""
        lost: Lost = []
        with self._lock:
            self._schedule.answered(replies, sent_at, error, time.monotonic(), lost)
        report(lost)
