"""A wake-up message and the waiters it wakes: shared by the sync notifier
(:mod:`.notifier`) and the async one.

A release publishes the token of the waiter that may now proceed (:data:`WAKE_ALL`:
all of them), or ``<token> <fence>`` when it already granted that waiter its lease.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from .pubsub import PubSubMode
from .scripts import as_text

__all__ = ["WAKE_ALL", "Channel", "Waiter", "dispatch", "named_waiters", "read_wake"]

W = TypeVar("W")

WAKE_ALL = "*"
"""Message payload that wakes every waiter on the channel."""


def read_wake(data: Any) -> tuple[str, int]:
    """A wake-up message: the token it names (or :data:`WAKE_ALL`) and the fence of the
    lease a release granted that waiter (0: only woken, it asks again). Shared by the
    sync notifier and the async one."""
    token, _, fence = as_text(data).partition(" ")
    return token, int(fence) if fence else 0


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
        self.event = threading.Event()  # set on a message for it, or on its turn to read
        self.notified = False  # a message named it (or all) since the owner last cleared it
        self.fence = 0  # > 0 once a release granted it its lease

    def is_notified(self) -> bool:
        """True once a message named this waiter (see :attr:`notified`)."""
        return self.notified


class Channel:
    """One subscribed channel of the sync notifier: its waiters by token, and the
    state of its subscription."""

    __slots__ = ("confirmed", "deaf", "idle_since", "sent", "waiters")

    def __init__(self) -> None:
        self.waiters: dict[str, Waiter] = {}
        self.confirmed = threading.Event()
        self.idle_since: float | None = None
        self.sent = False  # SUBSCRIBE reached redis-py (which re-sends it on reconnect)
        self.deaf = False  # lost after it was confirmed: messages may have been missed


def dispatch(channels: dict[str, Channel], mode: PubSubMode, message: dict[str, Any]) -> None:
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
