"""What the per-loop subscriber (:mod:`.notifier`) hands its waiters: a loop-free
flag (:class:`Signal`), one awaiting acquirer (:class:`AsyncWaiter`) and a channel's
record. No I/O; imports only asyncio.
"""

from __future__ import annotations

import asyncio

__all__ = ["AsyncWaiter", "Signal", "Tries"]


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
