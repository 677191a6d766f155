"""Wake-ups for blocked acquirers: one pub/sub connection per process and client.

A release publishes, on the primitive's ``wake`` channel, the token of the waiter
that may now proceed (or ``*`` for all of them), or ``<token> <fence>`` when the
release already granted that waiter its lease (a direct hand-off: the waiter need
not ask again, which saves the hand-off a round trip). Every waiter of a process
shares one subscriber connection, read by one daemon thread that sets the ``Event``
of the waiter named in the message; other waiters sleep on. A waiter never relies
on the message alone: it also polls, at most every ``max_poll`` seconds and never
later than the holder's TTL runs out, so a lost message costs latency, never
liveness (a poll finds a lease granted meanwhile, as a re-sent acquire does).

The subscription is confirmed before a waiter sleeps (and before it re-checks the
primitive), so a release that happens after that check always reaches it.
Channels stay subscribed for :data:`IDLE_UNSUBSCRIBE` seconds after their last
waiter leaves, so a busy lock does not pay SUBSCRIBE/UNSUBSCRIBE per wait. A reader
with no channel left for :data:`IDLE_STOP` seconds closes its connection and ends;
the notifier holds its client weakly, so short-lived clients leave nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from redis.exceptions import RedisError

from .scripts import as_text

__all__ = ["MAX_POLL", "WAITER_HEARTBEAT_MS", "WAKE_ALL", "Grant", "Notifier",
           "wait_until_granted"]

log = logging.getLogger(__name__)

WAKE_ALL = "*"
"""Message payload that wakes every waiter on the channel."""

IDLE_UNSUBSCRIBE = 10.0
"""Seconds a channel stays subscribed after its last waiter left."""

IDLE_STOP = 30.0
"""Seconds a reader thread with no subscribed channel waits before it ends."""

SUBSCRIBE_CONFIRM_TIMEOUT = 1.0
"""Longest a waiter waits for its SUBSCRIBE to be confirmed before relying on polls."""


GRANT_TRANSIT = 0.25
"""Seconds a grant message is assumed, at most, to take from the release that made it
to the reader thread: the lease's local deadline counts from that much before the
message arrived (and never from before the waiter's last request)."""

Grant = tuple[int, float]
"""A lease granted to a waiter: its fence, and a ``time.monotonic()`` no later than
the grant (the lease's local deadline counts from it)."""


class Waiter:
    """One blocked acquirer's mailbox: its event, and the grant a message brought."""

    __slots__ = ("event", "fence", "received_at")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.fence = 0  # > 0 once a release granted this waiter its lease
        self.received_at = 0.0


class _Channel:
    __slots__ = ("confirmed", "idle_since", "waiters")

    def __init__(self) -> None:
        self.waiters: dict[str, Waiter] = {}
        self.confirmed = threading.Event()
        self.idle_since: float | None = None


class Notifier:
    """The process's shared subscriber for one Redis client (see module docs)."""

    _registry: ClassVar[dict[tuple[int, int], Notifier]] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def for_client(cls, client: Any) -> Notifier:
        """Return this process's notifier for ``client``, creating it on first use."""
        key = (os.getpid(), id(client))
        notifier = cls._registry.get(key)
        if notifier is None:
            with cls._registry_lock:
                notifier = cls._registry.get(key)
                if notifier is None:
                    notifier = cls._registry[key] = cls(client)
                    weakref.finalize(client, cls._registry.pop, key, None)
        return notifier

    @classmethod
    def _forget_after_fork(cls) -> None:
        # The parent's reader thread and subscriber connection do not exist in a
        # forked child; start from nothing there.
        cls._registry = {}
        cls._registry_lock = threading.Lock()

    def __init__(self, client: Any) -> None:
        self._client = weakref.ref(client)  # a closed, dropped client must not be kept
        self._pubsub: Any = None
        self._channels: dict[str, _Channel] = {}
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def subscribed(self, channel: str) -> bool:
        """True while ``channel`` is subscribed and confirmed: a waiter that joins now
        hears every later message, so it may queue with its very first attempt."""
        entry = self._channels.get(channel)
        return entry is not None and entry.confirmed.is_set()

    @contextlib.contextmanager
    def listen(self, channel: str, token: str) -> Iterator[Waiter]:
        """Register ``token`` as a waiter on ``channel`` for the ``with`` block.

        Yields the :class:`Waiter`, whose event is set when a message names ``token``
        (or all), and whose ``fence`` is set first when the message says a release
        granted it. The subscription is confirmed (or
        :data:`SUBSCRIBE_CONFIRM_TIMEOUT` passed) on entry. Clear the event *before*
        each check of the primitive, then wait.
        """
        waiter = Waiter()
        entry = self._join(channel, token, waiter)
        try:
            entry.confirmed.wait(SUBSCRIBE_CONFIRM_TIMEOUT)
            yield waiter
        finally:
            self._leave(channel, token)

    def _join(self, channel: str, token: str, waiter: Waiter) -> _Channel:
        with self._lock:
            entry = self._channels.get(channel)
            new = entry is None
            if entry is None:
                entry = self._channels[channel] = _Channel()
            entry.waiters[token] = waiter
            entry.idle_since = None
            self._ensure_reader()
            if new:
                # Sent under the lock so it cannot cross an UNSUBSCRIBE of the same
                # channel from _unsubscribe_idle; sending does not wait for the reply.
                try:
                    self._pubsub.subscribe(channel)
                except RedisError as exc:  # Redis unreachable: the waiter polls instead.
                    log.debug("celery_redislock: SUBSCRIBE %s failed: %r", channel, exc)
        return entry

    def _leave(self, channel: str, token: str) -> None:
        with self._lock:
            entry = self._channels.get(channel)
            if entry is not None:
                entry.waiters.pop(token, None)
                if not entry.waiters:
                    entry.idle_since = time.monotonic()

    def _ensure_reader(self) -> None:
        if self._pubsub is None:
            client = self._client()
            assert client is not None  # a waiter's lock holds its client
            self._pubsub = client.pubsub()
        if self._reader is None or not self._reader.is_alive():
            self._reader = threading.Thread(
                target=self._read_forever,
                args=(self._pubsub,),
                name="celery-redislock-notifier",
                daemon=True,
            )
            self._reader.start()

    def _read_forever(self, pubsub: Any) -> None:
        idle_since = time.monotonic()
        while True:
            if self._channels:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_STOP and self._stop_if_idle(pubsub):
                return
            try:
                message = pubsub.get_message(timeout=1.0)
            except (RedisError, OSError, ValueError, AttributeError) as exc:
                # Redis restarted or unreachable, or the client closed the connection
                # under us (ValueError, or AttributeError when redis-py's parser was
                # torn down mid-read): redis-py reconnects and re-subscribes on the
                # next read; meanwhile waiters poll. This thread must never die.
                log.debug("celery_redislock: subscriber connection error: %r", exc)
                for entry in list(self._channels.values()):
                    entry.confirmed.clear()
                time.sleep(0.2)
                continue
            if message is not None:
                self._dispatch(message)
            self._unsubscribe_idle()

    def _stop_if_idle(self, pubsub: Any) -> bool:
        """End this reader if still no channel is in use (decided under the lock, so
        a waiter joining now gets a fresh connection and reader)."""
        with self._lock:
            if self._channels or self._pubsub is not pubsub:
                return False
            self._pubsub = None
            self._reader = None
        with contextlib.suppress(RedisError, OSError):
            pubsub.close()
        return True

    def _dispatch(self, message: dict[str, Any]) -> None:
        channel = as_text(message.get("channel"))
        entry = self._channels.get(channel)
        if entry is None:
            return
        kind = message.get("type")
        if kind == "subscribe":
            entry.confirmed.set()
        elif kind == "message":
            token, _, fence = as_text(message.get("data")).partition(" ")
            if token == WAKE_ALL:
                for each in list(entry.waiters.values()):
                    each.event.set()
            else:
                waiter = entry.waiters.get(token)
                if waiter is not None:
                    if fence:
                        waiter.received_at = time.monotonic()
                        waiter.fence = int(fence)
                    waiter.event.set()

    def _unsubscribe_idle(self) -> None:
        now = time.monotonic()
        idle: list[str] = []
        with self._lock:
            for channel, entry in list(self._channels.items()):
                if entry.idle_since is not None and now - entry.idle_since > IDLE_UNSUBSCRIBE:
                    del self._channels[channel]
                    idle.append(channel)
            if idle:
                with contextlib.suppress(RedisError):
                    self._pubsub.unsubscribe(*idle)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=Notifier._forget_after_fork)


MAX_POLL = 1.0
"""Longest sleep, in seconds, between two checks of a waiter: its heartbeat period."""

WAITER_HEARTBEAT_MS = 5000
"""A queued waiter that has not checked in for this long is dropped from the queue."""


def wait_until_granted(
    client: Any,
    channel: str,
    token: str,
    attempt: Callable[[], Grant | int],
    leave: Callable[[], int],
    release: Callable[[], object],
    deadline: float | None,
    max_poll: float = MAX_POLL,
) -> Grant | None:
    """Wait, queued as ``token``, until a lease is granted or ``deadline`` passes.

    ``attempt()`` tries once, queued, and returns the :data:`Grant`, else the
    milliseconds the holder's lease has left (0 when unknown). Between attempts the
    waiter sleeps until its wake-up message, the holder's TTL, ``max_poll`` or the
    deadline, whichever comes first; a message that says a release granted the lease
    ends the wait without another attempt. Unless granted, ``leave()`` removes the
    waiter from the queue on the way out and returns the fence of a lease granted to
    it meanwhile (else 0): on a timeout that lease is kept (it was granted in time),
    on an exception or interrupt ``release()`` gives it up.
    """
    last_asked = time.monotonic()
    try:
        with Notifier.for_client(client).listen(channel, token) as waiter:
            while True:
                waiter.event.clear()
                if waiter.fence:
                    return waiter.fence, max(last_asked, waiter.received_at - GRANT_TRANSIT)
                last_asked = time.monotonic()
                outcome = attempt()
                if isinstance(outcome, tuple):
                    return outcome
                sleep = max_poll if outcome <= 0 else min(max_poll, outcome / 1000.0 + 0.001)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    sleep = min(sleep, left)
                waiter.event.wait(sleep)
    except BaseException:
        with contextlib.suppress(RedisError):
            if _leave_quietly(leave):
                release()
        raise
    fence = _leave_quietly(leave)
    return (fence, last_asked) if fence else None


def _leave_quietly(leave: Callable[[], int]) -> int:
    """``leave()``, or 0 when Redis cannot be reached (the heartbeat lapses instead)."""
    try:
        return leave()
    except RedisError:
        return 0
