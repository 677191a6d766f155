"""Lease renewal for async code: one task per event loop renews every due lease.

The decisions are the sync renewer's own (:class:`~celery_redislock.core.renewal.
schedule.Schedule`: a lease is due TTL/3 after its last renewal was sent, every lease
at least TTL/6 along joins the same tick, a reply of 0 or a passed deadline is a
loss) and so are the batch calls (one script call per hash slot and script, at most
``MAX_BATCH`` leases, halved on a script error). Only the driving differs: a task
of the loop sleeps until the next due time, and each batch is sent by a task of its
own, so a Redis that does not answer never delays the loss check at a deadline.

Each loop has its own renewer, made on first use and dropped with the loop: nothing
is shared across loops or threads. Loss is reported on the loop (``lease.lost``,
``lease.lost_event``, ``on_lost``) within one tick.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ..core.lease_state import LeaseState
from ..core.renewal.entry import Entry, Renewable, report
from ..core.renewal.schedule import Lost, Schedule
from ..core.renewal.sender import (
    MAX_BATCH,
    batch_call,
    batch_replies,
    check_batch_reply,
    failure,
    splits,
)
from ..core.scripts import LuaScript
from .calls import call
from .notifier import Signal

__all__ = ["IDLE_EXIT", "AsyncRenewer", "keep_alive_async", "renewer_for_loop"]

IDLE_EXIT = 10.0
"""Seconds a loop's renewal task lingers with nothing to renew before it ends."""

_renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRenewer] = (
    weakref.WeakKeyDictionary()
)


class AsyncRenewer:
    """One event loop's renewer; use :func:`renewer_for_loop`."""

    def __init__(self) -> None:
        # No reference to the loop (the registry is weak on it): tasks are made from
        # inside it, and the wake-up signal binds to it only while the task sleeps.
        self._wake = Signal()
        self._schedule = Schedule(self._wake.set)
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()

    @property
    def tracked(self) -> int:
        """How many leases are being renewed (or watched until their deadline)."""
        return self._schedule.live

    def add(self, lease: LeaseState, holder: Renewable, max_hold: float | None) -> Entry:
        """Start renewing ``lease``; returns its entry, whose ``stop()`` ends renewal."""
        granted = lease.deadline - lease.ttl
        stop_at = None if max_hold is None else granted + max_hold
        entry = Entry(lease, holder, self._schedule.drop, stop_at)
        entry.renewer = self  # for explicit TTL changes (LeaseState._explicit)
        self._schedule.add(entry, lease)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="celery-redislock-renewer"
            )
        return entry

    def explicit(self, entry: Entry, ttl: float) -> int:
        """``entry``'s lease is about to be set to ``ttl`` s explicitly: its new
        generation (see :meth:`~celery_redislock.core.renewal.schedule.Schedule.explicit`)."""
        lease = entry.lease()
        return 0 if lease is None else self._schedule.explicit(entry, lease, ttl)

    def rescheduled(self, entry: Entry, sent_at: float, ttl: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on its TTL."""
        self._schedule.rescheduled(entry, sent_at, ttl)

    async def _run(self) -> None:
        schedule = self._schedule
        try:
            while True:
                lost: Lost = []
                ready = schedule.collect(time.monotonic(), lost)
                if ready:
                    self._send_all(ready)
                report(lost)
                if ready or lost:
                    continue
                due = schedule.next_due()
                timeout = IDLE_EXIT if due is None else max(0.0, due - time.monotonic())
                schedule.wake_at = time.monotonic() + timeout
                self._wake.clear()
                woken = await self._wake.wait(timeout)
                schedule.wake_at = math.inf
                if due is None and not woken and not schedule.live:
                    return
        except asyncio.CancelledError:
            # The loop is shutting down: forget every lease (their holders, clients
            # and connections would otherwise keep the closed loop alive).
            schedule.heap.clear()
            schedule.live = 0
            raise
        finally:
            self._task = None

    def _send_all(self, ready: list[tuple[Entry, int]]) -> None:
        groups: dict[tuple[LuaScript, int], list[tuple[Entry, int]]] = {}
        for entry, ttl_ms in ready:
            groups.setdefault((entry.script, entry.slot), []).append((entry, ttl_ms))
        loop = asyncio.get_running_loop()
        for (script, _slot), items in groups.items():
            for start in range(0, len(items), MAX_BATCH):
                task = loop.create_task(self._send(script, items[start : start + MAX_BATCH]))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)

    async def _send(self, script: LuaScript, items: list[tuple[Entry, int]]) -> None:
        keys, args = batch_call(items)
        sent_at = time.monotonic()
        error = ""
        renewed: list[object] = []
        try:
            client = items[0][0].client
            if not isinstance(client, (AsyncRedis, AsyncRedisCluster)):
                raise TypeError(f"the asyncio renewer got {client!r}")  # async leases only
            reply = await call(script, client, keys, args)
            renewed = check_batch_reply(script, items, reply)
        except Exception as exc:  # every failure is retried until the lease's deadline
            if splits(exc, items):
                await self._send(script, items[: len(items) // 2])
                await self._send(script, items[len(items) // 2 :])
                return
            error = failure(exc, items)
        lost: Lost = []
        self._schedule.answered(
            batch_replies(items, renewed, error), sent_at, error, time.monotonic(), lost
        )
        report(lost)


def renewer_for_loop() -> AsyncRenewer:
    """The running loop's renewer, made on first use."""
    loop = asyncio.get_running_loop()
    renewer = _renewers.get(loop)
    if renewer is None:
        renewer = _renewers[loop] = AsyncRenewer()
    return renewer


def keep_alive_async(lease: LeaseState, holder: Renewable, max_hold: float | None) -> None:
    """Renew ``lease`` from the running loop until it is released, lost or collected."""
    if lease.released or lease.lost or lease._stop_renewal is not None:
        return
    lease._stop_renewal = renewer_for_loop().add(lease, holder, max_hold)
