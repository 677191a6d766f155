"""The process's subscriber for wake-ups: one pub/sub connection per client, read
by one thread.

A release publishes, on ``<wake channel>:<process tag>``, the token of the waiter that
may now proceed (``*``: all of them), or ``<token> <fence>`` when it already granted
that waiter its lease. Every waiter of a process shares one subscriber connection,
read by the notifier's reader thread (started by the first waiter, ending once no
channel is left): it marks the waiters the messages name and wakes them; a waiter
only sleeps on its own event.

A message names the token of the waiter that may now proceed (:data:`WAKE_ALL`: all
of them), or ``<token> <fence>`` when a release already granted that waiter its
lease (:func:`read_wake`); the async notifier reads the same messages.

Channels stay subscribed for :data:`IDLE_UNSUBSCRIBE` seconds after their last waiter
left (a busy lock does not pay SUBSCRIBE/UNSUBSCRIBE per wait); the reader then
unsubscribes them, and ends when none is left. The connection lasts as long as its
client: the notifier holds the client weakly and is dropped with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

from redis.client import PubSub
from redis.exceptions import RedisError, ResponseError

from .pubsub import PubSubMode, new_pubsub, pubsub_mode
from .scripts import RedisClient, as_text

__all__ = [
    "IDLE_UNSUBSCRIBE",
    "SUBSCRIBE_CONFIRM_TIMEOUT",
    "WAKE_ALL",
    "Notifier",
    "Waiter",
    "named_waiters",
    "read_wake",
]

log = logging.getLogger(__name__)

IDLE_UNSUBSCRIBE = 10.0
"""Seconds a channel stays subscribed after its last waiter left."""

SUBSCRIBE_CONFIRM_TIMEOUT = 1.0
"""Longest a waiter waits for its SUBSCRIBE to be confirmed before relying on polls."""

_READ_SLICE = 1.0  # longest single read, so idle channels are unsubscribed on time

# -- the wake-up messages and the waiters they wake (the async notifier reads them too)

W = TypeVar("W")

WAKE_ALL = "*"
"""Message payload that wakes every waiter on the channel."""


def read_wake(data: bytes | str | None) -> tuple[str, int]:
    """A wake-up message: the token it names (or :data:`WAKE_ALL`) and the fence of the
    lease a release granted that waiter (0: only woken, it asks again). Shared by the
    sync notifier and the async one. Anything else names no one: ``("", 0)``."""
    token, _, fence = as_text(data).partition(" ")
    try:
        number = int(fence) if fence else 0
    except ValueError:
        number = -1
    if number < 0:
        # Not a release's message (anyone may PUBLISH on the channel): it names no
        # one. Raised, it ended the reader, leaving every waiter to its polls.
        return "", 0
    return token, number


def named_waiters(waiters: dict[str, W], token: str) -> list[W]:
    """The waiters of a channel that a message naming ``token`` wakes."""
    if token == WAKE_ALL:
        return list(waiters.values())
    waiter = waiters.get(token)
    return [] if waiter is None else [waiter]


class Waiter:
    """One blocked acquirer: what the messages told it, and the event that wakes it."""

    __slots__ = ("event", "fence", "notified")

    def __init__(self) -> None:
        self.event = threading.Event()  # set by the reader on a message for it
        self.notified = False  # a message named it (or all) since the owner last cleared it
        self.fence = 0  # > 0 once a release granted it its lease

    def is_notified(self) -> bool:
        """True once a message named this waiter (see :attr:`notified`)."""
        return self.notified


class _Channel:
    """One subscribed channel of the sync notifier: its waiters by token, and the
    state of its subscription."""

    __slots__ = ("confirmed", "deaf", "idle_since", "sent", "waiters")

    def __init__(self) -> None:
        self.waiters: dict[str, Waiter] = {}
        self.confirmed = threading.Event()
        self.idle_since: float | None = None
        self.sent = False  # SUBSCRIBE reached redis-py (which re-sends it on reconnect)
        self.deaf = False  # lost after it was confirmed: messages may have been missed


def dispatch(channels: dict[str, _Channel], mode: PubSubMode, message: dict[str, Any]) -> None:
    """Act on one pub/sub ``message`` for the sync notifier's ``channels``: a confirmed
    subscription, a lost one, or a wake-up for the waiters it names."""
    entry = channels.get(as_text(message.get("channel")))
    if entry is None:
        return
    kind = as_text(message.get("type"))
    if kind == mode.confirmed:
        entry.confirmed.set()
        # Subscribed again after a loss: a release meanwhile was not heard, so the
        # waiters ask again (else they would wait for their next poll).
        deaf, entry.deaf = entry.deaf, False
        for waiter in list(entry.waiters.values()):
            waiter.notified = waiter.notified or deaf
            waiter.event.set()
    elif kind == mode.ended and entry.waiters:
        # Not asked for (idle channels are dropped before UNSUBSCRIBE): the node
        # gave the slot away. Every waiter asks again at once; the MOVED that
        # answers refreshes the client's slot map, and redis-py then subscribes
        # again on the slot's new owner (see .pubsub), which wakes them once more.
        entry.confirmed.clear()
        entry.deaf = True
        for waiter in list(entry.waiters.values()):
            waiter.notified = True
            waiter.event.set()
    elif kind == mode.message:
        token, fence = read_wake(message.get("data"))
        for waiter in named_waiters(entry.waiters, token):
            if fence:
                waiter.fence = int(fence)
            waiter.notified = True
            waiter.event.set()


# -- the subscriber -----------------------------------------------------------------


class Notifier:
    """The process's shared subscriber for one Redis client (see module docs)."""

    _registry: ClassVar[dict[int, Notifier]] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def for_client(cls, client: RedisClient) -> Notifier:
        """Return this process's notifier for ``client``, creating it on first use."""
        key = id(client)  # the registry is emptied in a forked child
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
        # The parent's subscriber connection is not ours in a forked child. Its socket
        # is closed here -- the child's copy of the descriptor only: close(), never
        # shutdown(), which would cut the parent's connection too. Kept open, it would
        # keep the connection alive after the parent died (SIGKILL), PUBSUB NUMSUB
        # would count the dead waiter as listening, and a release would grant it a
        # lease nobody uses for a whole TTL.
        for notifier in list(cls._registry.values()):
            notifier._close_inherited()
        cls._registry = {}
        cls._registry_lock = threading.Lock()

    def _close_inherited(self) -> None:
        # redis-py's disconnect() in a process other than the connection's maker only
        # closes the socket (no shutdown): the parent's connection is not cut.
        connection = None if self._pubsub is None else self._pubsub.connection
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.disconnect()

    def __init__(self, client: RedisClient) -> None:
        self._client = weakref.ref(client)  # a closed, dropped client must not be kept
        self._mode = pubsub_mode(client)  # classic or sharded, as the tokens say
        self._pubsub: PubSub | None = None
        self._channels: dict[str, _Channel] = {}
        self._lock = threading.Lock()  # guards _channels, _reader and (un)subscribing
        self._reader: threading.Thread | None = None
        self._next_sweep = 0.0

    def subscribed(self, channel: str) -> bool:
        """True while ``channel`` is subscribed and confirmed: a waiter that joins now
        hears every later message, so it may queue with its very first attempt."""
        entry = self._channels.get(channel)
        return entry is not None and entry.confirmed.is_set()

    @contextlib.contextmanager
    def listen(self, channel: str, token: str, deadline: float | None = None) -> Iterator[Waiter]:
        """Register ``token`` as a waiter on ``channel`` for the ``with`` block.

        The subscription is confirmed (or :data:`SUBSCRIBE_CONFIRM_TIMEOUT` passed, or
        the caller's ``deadline``, a ``time.monotonic()`` instant) on entry. Clear
        :attr:`Waiter.notified` *before* each check of the primitive,
        then :meth:`wait`.
        """
        waiter = Waiter()
        entry = self._join(channel, token, waiter)
        try:
            if not entry.confirmed.is_set():
                wait = SUBSCRIBE_CONFIRM_TIMEOUT
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                self._await(waiter, entry.confirmed.is_set, wait)
            yield waiter
        finally:
            self._leave(channel, token)

    def wait(self, waiter: Waiter, timeout: float) -> None:
        """Block until a message names ``waiter`` or ``timeout`` seconds pass."""
        self._await(waiter, waiter.is_notified, timeout)

    # -- membership -------------------------------------------------------------------

    def _join(self, channel: str, token: str, waiter: Waiter) -> _Channel:
        with self._lock:
            entry = self._channels.get(channel)
            if entry is None:
                entry = self._channels[channel] = _Channel()
            entry.waiters[token] = waiter
            entry.idle_since = None
            if self._pubsub is None:
                client = self._client()
                assert client is not None  # a waiter's lock holds its client
                self._pubsub = new_pubsub(client)
            if not entry.sent:
                self._subscribe(channel, entry)
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read, name="celery-redislock-notifier", daemon=True
                )
                self._reader.start()
        return entry

    def _subscribe(self, channel: str, entry: _Channel) -> None:
        # Called under self._lock, so it cannot cross an UNSUBSCRIBE of the same
        # channel; sending does not wait for the confirmation (a reader reads it).
        try:
            getattr(self._pubsub, self._mode.subscribe)(channel)
        except RedisError as exc:
            # Redis unreachable: the waiters poll meanwhile. redis-py records a channel
            # only once SUBSCRIBE was sent, so its reconnect would never subscribe this
            # one: the next waiter to join, or the reader's next sweep, sends it again.
            log.debug("celery_redislock: SUBSCRIBE %s failed: %r", channel, exc)
        else:
            entry.sent = True

    def _leave(self, channel: str, token: str) -> None:
        with self._lock:
            entry = self._channels.get(channel)
            if entry is not None:
                entry.waiters.pop(token, None)
                if not entry.waiters:
                    entry.idle_since = time.monotonic()

    # -- waiting and reading ----------------------------------------------------------

    @staticmethod
    def _await(waiter: Waiter, done: Callable[[], bool], timeout: float) -> None:
        """Until ``done()`` or the timeout: the reader wakes the waiter on a message."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            waiter.event.wait(left)
            waiter.event.clear()  # done() is checked again: a wake-up is never lost

    def _read(self) -> None:
        """The reader thread: read and dispatch until no channel is left (or the
        client is gone)."""
        while True:
            with self._lock:
                if not self._channels or self._client() is None:
                    self._reader = None
                    return
            pubsub = self._pubsub  # replaced when pinned to a node that failed
            assert pubsub is not None  # made before the reader started
            try:
                message = self._mode.read(pubsub, _READ_SLICE)
            except ResponseError as exc:
                # An error reply in the stream, the connection is fine: e.g. MOVED for
                # redis-py's SUNSUBSCRIBE sent to a node a slot left (see .pubsub).
                log.debug("celery_redislock: subscriber error reply: %r", exc)
                continue
            except (RedisError, OSError, ValueError, AttributeError) as exc:
                # Redis restarted or unreachable, or the connection was closed under us:
                # redis-py reconnects and re-subscribes on the next read; meanwhile the
                # waiters poll.
                log.debug("celery_redislock: subscriber connection error: %r", exc)
                for entry in list(self._channels.values()):
                    entry.deaf = entry.deaf or entry.confirmed.is_set()
                    entry.confirmed.clear()
                if self._mode.pinned(pubsub):
                    with self._lock:
                        if self._pubsub is pubsub:
                            self._new_pubsub()
                time.sleep(0.2)
                continue
            if message is not None:
                dispatch(self._channels, self._mode, message)
            if time.monotonic() >= self._next_sweep:
                self._sweep()

    def _new_pubsub(self) -> None:
        """Under ``_lock``: a new subscriber for one pinned to a cluster node that failed
        (see :meth:`.PubSubMode.pinned`); the channels with waiters are subscribed again
        through the node the client's slot map names now (the waiters' requests refresh
        it). A SUBSCRIBE that fails pins the new one to a dead node too: the sweep
        makes another until one succeeds."""
        client, old = self._client(), self._pubsub
        if client is None:
            return
        self._pubsub = new_pubsub(client)
        for channel, entry in self._channels.items():
            entry.sent = False
            if entry.waiters:
                self._subscribe(channel, entry)
        if old is not None:
            with contextlib.suppress(Exception):  # a dead node's connection: just drop it
                old.reset()

    def _sweep(self) -> None:
        """Unsubscribe idle channels; subscribe again those whose SUBSCRIBE failed."""
        now = time.monotonic()
        self._next_sweep = now + _READ_SLICE
        with self._lock:
            unsent = [
                name for name, entry in self._channels.items() if not entry.sent and entry.waiters
            ]
            if unsent and self._pubsub is not None and self._mode.pinned(self._pubsub):
                self._new_pubsub()
            else:
                for channel in unsent:
                    self._subscribe(channel, self._channels[channel])
            idle = [
                channel
                for channel, entry in self._channels.items()
                if entry.idle_since is not None and now - entry.idle_since > IDLE_UNSUBSCRIBE
            ]
            for channel in idle:
                del self._channels[channel]
            if idle:
                with contextlib.suppress(RedisError):
                    getattr(self._pubsub, self._mode.unsubscribe)(*idle)


os.register_at_fork(after_in_child=Notifier._forget_after_fork)
