"""A wake-up message and the waiters it wakes: shared by the sync notifier
(:mod:`.notifier`) and the async one.

A release publishes the token of the waiter that may now proceed (:data:`WAKE_ALL`:
all of them), or ``<token> <fence>`` when it already granted that waiter its lease.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from .scripts import as_text

__all__ = ["WAKE_ALL", "Channel", "Waiter", "named_waiters", "read_wake"]

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
