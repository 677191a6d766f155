"""Wake-ups for async waiters: one pub/sub connection per event loop and client.

The async twin of :mod:`celery_redislock.core.notifier`, reading the same messages
with the same rules (:func:`~celery_redislock.core.notifier.read_wake`): a release
publishes, on ``<wake channel>:<process tag>``, the token of the waiter that may go
on, or ``<token> <fence>`` when it already granted that waiter its lease. The
waiters of one loop and client share one subscriber connection and reader task.

Nothing crosses loops: a (loop, client) pair's notifier is found only from inside
that loop, and dropped with it. Channels stay subscribed ``IDLE_UNSUBSCRIBE`` seconds
after their last waiter left; the reader task ends, closing its connection, once no
channel is left (or when its loop cancels it at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ..core.clients import AsyncRedisClient, close_pubsub
from ..core.notifier import (
    IDLE_UNSUBSCRIBE,
    SUBSCRIBE_CONFIRM_TIMEOUT,
    named_waiters,
    read_wake,
)
from ..core.primitive import fresh_token
from ..core.scripts import as_text

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

__all__ = ["AsyncNotifier", "AsyncWaiter", "Signal"]

log = logging.getLogger(__name__)

_READ_SLICE = 1.0  # longest single read, so idle channels are unsubscribed on time


class Signal:
    """A flag tasks can await with a timeout: an ``asyncio.Event`` that holds no
    reference to its loop while nobody waits (the per-loop registries are weak on
    the loop; an Event bound to it would keep it alive)."""

    __slots__ = ("_futures", "_set")

    def __init__(self) -> None:
        self._set = False
        self._futures: list[asyncio.Future[bool]] = []

    def is_set(self) -> bool:
        """True between :meth:`set` and :meth:`clear`."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiting task."""
        self._set = True
        for future in self._futures:
            _resolve(future, True)

    def clear(self) -> None:
        """Clear the flag."""
        self._set = False

    async def wait(self, timeout: float) -> bool:
        """Until set or ``timeout`` seconds pass; True when set."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(timeout, _resolve, future, False)
        self._futures.append(future)
        try:
            return await future
        finally:
            timer.cancel()
            self._futures.remove(future)


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class AsyncWaiter:
    """One awaiting acquirer: what the messages told it, and the future that wakes it
    (a bare future and a timer: cheaper than an Event under ``wait_for``, which costs
    a task per wait)."""

    __slots__ = ("fence", "future", "notified")

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None  # set while it waits
        self.notified = False  # a message named it (or all) since the owner cleared it
        self.fence = 0  # > 0 once a release granted it its lease

    def wake(self) -> None:
        """End the current wait, if any."""
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)


class Tries:
    """The acquires of one loop trying a channel before subscribing to it: how many,
    and a flag set once the last of them is answered."""

    __slots__ = ("count", "done")

    def __init__(self) -> None:
        self.count = 0
        self.done = Signal()


class _Channel:
    __slots__ = ("confirmed", "idle_since", "sent", "starting", "waiters")

    def __init__(self) -> None:
        self.waiters: dict[str, AsyncWaiter] = {}
        self.confirmed = Signal()
        self.idle_since: float | None = None
        self.sent = False
        self.starting: object = None  # the task subscribing it, while it runs


_numbers = itertools.count(1)  # tags the notifiers of a process apart

_registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, AsyncNotifier]] = (
    weakref.WeakKeyDictionary()
)


class AsyncNotifier:
    """The subscriber of one event loop for one ``redis.asyncio`` client."""

    @classmethod
    def for_client(cls, client: AsyncRedisClient) -> AsyncNotifier:
        """The running loop's notifier for ``client``, made on first use."""
        loop = asyncio.get_running_loop()
        per_loop = _registry.get(loop)
        if per_loop is None:
            per_loop = _registry[loop] = {}
        notifier = per_loop.get(id(client))
        if notifier is None or notifier._client() is not client:
            notifier = per_loop[id(client)] = cls(client)
        return notifier

    @staticmethod
    def current(client: AsyncRedisClient) -> AsyncNotifier | None:
        """The running loop's notifier for ``client`` if it has one (none is made)."""
        per_loop = _registry.get(asyncio.get_running_loop())
        notifier = None if per_loop is None else per_loop.get(id(client))
        if notifier is None or notifier._client() is not client:
            return None
        return notifier

    def __init__(self, client: AsyncRedisClient) -> None:
        self._client = weakref.ref(client)
        # This loop's waiter tag (the process's and a number): a semaphore waiter's token
        # ends in ".<tag>", so releases wake it on a channel only this loop reads, and a
        # release sent from this loop names its grants in the reply (see hand_over).
        self.tag = f"{fresh_token()[1]}n{next(_numbers)}"
        self._pubsub: PubSub | None = None  # the reader's connection, while one is needed
        self._channels: dict[str, _Channel] = {}
        self._reader: asyncio.Task[None] | None = None
        # One SUBSCRIBE in flight at a time: redis.asyncio's PubSub.connect, run by
        # concurrent callers before it has a connection, takes a pooled connection for
        # each and keeps the last, never giving back the others (a blocking pool ran
        # dry). Not an asyncio.Lock: that keeps its loop alive (the registry is weak).
        self._subscribing = False
        self._trying: dict[str, Tries] = {}  # channel -> acquires trying unsubscribed
        self._subscribed = Signal()

    def subscribed(self, channel: str) -> bool:
        """True while ``channel`` is subscribed and confirmed: a waiter that joins now
        hears every later message, so it may queue with its very first attempt."""
        entry = self._channels.get(channel)
        return entry is not None and entry.confirmed.is_set()

    def fresh_token(self) -> str:
        """A fresh unguessable token of this loop's waiters (see :attr:`tag`)."""
        return f"{secrets.token_hex(16)}.{self.tag}"

    def hand_over(self, channel: str, grants: list[tuple[str, int]]) -> None:
        """A release sent from this loop granted these ``(token, fence)``: wake each
        waiter as its message would have (one no longer waiting left the queue, or
        will: its leave finds the lease, see :mod:`.waiting`)."""
        entry = self._channels.get(channel)
        if entry is None:
            return
        for token, fence in grants:
            waiter = entry.waiters.get(token)
            if waiter is not None:
                waiter.fence = fence
                waiter.notified = True
                waiter.wake()

    def alone(self, channel: str, room: int = 1) -> bool:
        """True when no acquire of this loop waits on ``channel``, fewer than ``room`` try
        it (see :meth:`trying`; a semaphore's limit) and it is not subscribed: a new
        acquire may then try once before subscribing. Otherwise it joins first, so a
        burst of acquires in one loop subscribes once and each tries once, subscribed."""
        entry = self._channels.get(channel)
        if entry is not None and (entry.waiters or entry.confirmed.is_set()):
            return False
        tries = self._trying.get(channel)
        return tries is None or tries.count < room

    @contextlib.contextmanager
    def trying(self, channel: str) -> Iterator[None]:
        """Mark an acquire's try on ``channel`` made before subscribing (see :meth:`alone`)."""
        tries = self._trying.get(channel)
        if tries is None:
            tries = self._trying[channel] = Tries()
        tries.count += 1
        try:
            yield
        finally:
            tries.count -= 1
            if not tries.count:
                del self._trying[channel]
                tries.done.set()

    async def join(self, channel: str, token: str, deadline: float | None = None) -> AsyncWaiter:
        """Register ``token`` on ``channel``; returns once the subscription is confirmed
        and this loop's tries made before it are answered (or ``SUBSCRIBE_CONFIRM_TIMEOUT``
        passed: the waiter then relies on polls). Pair with :meth:`leave` in a ``finally``."""
        waiter = AsyncWaiter()
        entry = self._channels.get(channel)
        if entry is None:
            entry = self._channels[channel] = _Channel()
        entry.waiters[token] = waiter
        entry.idle_since = None
        if self._pubsub is None:
            client = self._client()
            assert client is not None  # a waiter's lock holds its client
            self._pubsub = client.pubsub()
        if not entry.sent and entry.starting is None:
            # In a task of its own: a Redis that does not answer (paused) holds the
            # SUBSCRIBE, never the waiters past their deadline.
            task = entry.starting = asyncio.get_running_loop().create_task(
                self._start(channel, entry)
            )
            task.add_done_callback(lambda _: setattr(entry, "starting", None))
        elif entry.sent:
            self._ensure_reader()
        until = time.monotonic() + SUBSCRIBE_CONFIRM_TIMEOUT
        until = until if deadline is None else min(until, deadline)  # never past it
        if until > time.monotonic():
            await entry.confirmed.wait(until - time.monotonic())
        tries = self._trying.get(channel)
        if tries is not None and until > time.monotonic():
            # Queue behind them: an earlier acquire's try still in flight (maybe on a new
            # connection) would reach Redis after this waiter's first attempt (not FIFO).
            await tries.done.wait(until - time.monotonic())
        return waiter

    def leave(self, channel: str, token: str) -> None:
        """Unregister ``token`` (no I/O: idle channels are dropped by the reader)."""
        entry = self._channels.get(channel)
        if entry is not None:
            entry.waiters.pop(token, None)
            if not entry.waiters:
                entry.idle_since = time.monotonic()

    @staticmethod
    async def wait(waiter: AsyncWaiter, timeout: float) -> None:
        """Until a message names ``waiter`` or ``timeout`` seconds pass."""
        if waiter.notified or timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        future = waiter.future = loop.create_future()
        timer = loop.call_later(timeout, waiter.wake)
        try:
            await future
        finally:
            timer.cancel()
            waiter.future = None

    async def _start(self, channel: str, entry: _Channel) -> None:
        await self._subscribe(channel, entry)
        self._ensure_reader()

    def _ensure_reader(self) -> None:
        """Start a reader unless one runs, handing it the connection it reads and
        closes. The last reader may have ended (and closed its connection) while this
        caller awaited -- a ``_start`` whose SUBSCRIBE was in flight: when waiters are
        left, the new reader gets a new connection and subscribes their channels at
        once (see :meth:`_read`); it never starts on none."""
        if (self._reader is not None and not self._reader.done()) or not self._channels:
            return
        pubsub = self._pubsub
        if pubsub is None:
            client = self._client()
            if client is None or not any(entry.waiters for entry in self._channels.values()):
                return
            pubsub = self._pubsub = client.pubsub()
        self._reader = asyncio.get_running_loop().create_task(
            self._read(pubsub), name="celery-redislock-subscriber"
        )

    async def _subscribe(self, channel: str, entry: _Channel) -> None:
        while self._subscribing:
            await self._subscribed.wait(SUBSCRIBE_CONFIRM_TIMEOUT)
        pubsub = self._pubsub
        if entry.sent or pubsub is None:  # subscribed meanwhile, or closed
            return
        self._subscribing = True
        self._subscribed.clear()
        try:
            await pubsub.subscribe(channel)
        except RedisError as exc:  # unreachable: the waiters poll; the reader retries
            log.debug("celery_redislock: SUBSCRIBE %s failed: %r", channel, exc)
        else:
            if self._pubsub is pubsub:
                entry.sent = True
            else:
                # Its reader ended meanwhile and closed it: redis-py connected it again
                # for this SUBSCRIBE, which no reader will read. Not sent: the next
                # reader subscribes the channel on its own connection.
                with contextlib.suppress(Exception):
                    await close_pubsub(pubsub)
        finally:
            self._subscribing = False
            self._subscribed.set()

    async def _read(self, pubsub: PubSub) -> None:
        next_sweep = time.monotonic() + _READ_SLICE
        try:
            if any(entry.waiters and not entry.sent for entry in self._channels.values()):
                await self._sweep()  # taking over from a reader that ended with waiters
            while self._channels:
                try:
                    if not pubsub.subscribed:  # nothing to read yet (SUBSCRIBE failed)
                        await asyncio.sleep(0.2)
                        message = None
                    else:
                        message = await pubsub.get_message(timeout=_READ_SLICE)
                except (RedisError, OSError) as exc:
                    # Redis restarted or down: redis-py subscribes again on the next read.
                    log.debug("celery_redislock: async subscriber error: %r", exc)
                    for entry in self._channels.values():
                        entry.confirmed.clear()
                    await asyncio.sleep(0.2)
                    continue
                if message is not None:
                    self._dispatch(message)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + _READ_SLICE
                    await self._sweep()
        finally:
            # Last channel dropped, or the loop is shutting down: close the connection.
            # What is this reader's only: a successor may already run on a new one.
            if self._reader is asyncio.current_task():
                self._reader = None
            if self._pubsub is pubsub:
                self._pubsub = None
                for entry in self._channels.values():
                    entry.sent = False
                    entry.confirmed.clear()
            with contextlib.suppress(Exception):
                await close_pubsub(pubsub)

    def _dispatch(self, message: dict[str, Any]) -> None:
        entry = self._channels.get(as_text(message.get("channel")))
        if entry is None:
            return
        kind = as_text(message.get("type"))
        if kind == "subscribe":
            entry.confirmed.set()
        elif kind == "message":
            token, fence = read_wake(message.get("data"))
            for waiter in named_waiters(entry.waiters, token):
                if fence:
                    waiter.fence = fence
                waiter.notified = True
                waiter.wake()

    async def _sweep(self) -> None:
        """Unsubscribe idle channels; subscribe again those whose SUBSCRIBE failed."""
        now = time.monotonic()
        for channel, entry in list(self._channels.items()):
            if not entry.sent and entry.waiters:
                await self._subscribe(channel, entry)
        idle = [
            channel
            for channel, entry in self._channels.items()
            if not entry.waiters
            and entry.idle_since is not None
            and now - entry.idle_since > IDLE_UNSUBSCRIBE
        ]
        for channel in idle:
            del self._channels[channel]
        if idle and self._pubsub is not None:
            with contextlib.suppress(RedisError):
                await self._pubsub.unsubscribe(*idle)
