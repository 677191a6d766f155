"""``AsyncLease``: the lease an async lock or semaphore grants.

The same state and loss rules as the sync :class:`~celery_redislock.core.lease.Lease`
(both are a :class:`~celery_redislock.core.lease_state.LeaseState`); its operations
are coroutines, and it belongs to the event loop that acquired it: using it from
another loop raises :class:`~celery_redislock.errors.RedisLockError` (its client's
connections, its renewer and its wake-ups all live on that loop).

Loss is reported three ways: :attr:`AsyncLease.lost` (a bool, as for the sync
lease), :attr:`AsyncLease.lost_event` (an :class:`asyncio.Event`, or ``await
lease.wait_lost()``) and the ``on_lost(lease)`` callback, run on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar

from ..core.lease_state import LeaseState, Steps
from ..errors import LockNotOwned, RedisLockError

__all__ = ["AsyncLease", "AsyncLeaseHolder", "AsyncOnLost"]

T = TypeVar("T")

AsyncOnLost = Callable[["AsyncLease"], None]
"""Signature of an ``on_lost`` callback: called once, on the loop, with the lost lease."""


class AsyncLeaseHolder(Protocol):
    """What an async lock or semaphore offers its leases (one round trip each)."""

    @property
    def name(self) -> str:
        """The lock or semaphore name."""
        ...

    async def _release_lease(self, token: str, deadline: float) -> bool: ...

    async def _extend_token(self, token: str, ttl_ms: int, gen: int = 0) -> bool: ...

    async def _held_token(self, token: str) -> int: ...

    async def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int: ...

    def _release_later(self, token: str) -> None: ...


class AsyncLease(LeaseState):
    """Ownership of one lock or semaphore permit, for async code (see the module docs
    and :class:`~celery_redislock.core.lease_state.LeaseState` for its attributes)."""

    __slots__ = ("_loop", "_lost_event")

    _holder: AsyncLeaseHolder

    def __init__(
        self,
        holder: AsyncLeaseHolder,
        token: str,
        fence: int,
        ttl: float,
        *,
        owner: str | None = None,
        granted_at: float | None = None,
        on_lost: AsyncOnLost | None = None,
    ) -> None:
        super().__init__(
            holder, token, fence, ttl, owner=owner, granted_at=granted_at, on_lost=on_lost
        )
        self._loop = asyncio.get_running_loop()
        self._lost_event: asyncio.Event | None = None

    @property
    def holder(self) -> AsyncLeaseHolder:
        """The lock or semaphore that granted this lease."""
        return self._holder

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the lease belongs to."""
        return self._loop

    @property
    def lost_event(self) -> asyncio.Event:
        """An event set when the lease is found lost (await ``lost_event.wait()``)."""
        if self._lost_event is None:
            self._lost_event = asyncio.Event()
            if self.lost:
                self._lost_event.set()
        return self._lost_event

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Until the lease is found lost or ``timeout`` passes; returns :attr:`lost`."""
        self._check_loop()
        event = self.lost_event
        if not event.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        return self.lost

    async def release(self) -> bool:
        """Give the lease back; False (and :attr:`lost` set) when it was no longer ours.

        Cancelled while the release is in flight, it is sent again in the background
        (the lease is never left held because its holder was cancelled)."""
        if self._released:
            return False
        self._check_loop()
        try:
            return await self._drive(self._release_steps())
        except BaseException:
            self._released = True
            self._holder._release_later(self.token)
            raise

    async def extend(self, ttl: float | None = None, *, add: bool = False) -> bool:
        """Reset the lease to ``ttl`` seconds (default: its TTL) from now, or with
        ``add=True`` add ``ttl`` seconds to what it has left, as the sync lease does;
        False (and :attr:`lost` set) when it is no longer ours. A renewed lease's change
        gets a new generation (a renewal in flight cannot undo it) and renewal goes on
        at the new TTL."""
        return await self._drive(self._extend_steps(ttl, add))

    async def held(self) -> bool:
        """True while the lease is live on Redis (one read-only round trip)."""
        if not self._released and not self.lost:
            self._check_loop()
        return await self._drive(self._held_steps())

    async def hand_over(self, ttl: float) -> bool:
        """Stop renewing the lease, set it to expire ``ttl`` seconds from now and forget
        it here (for another process to ``adopt``); False when it was no longer ours."""
        return await self._drive(self._hand_over_steps(ttl))

    async def _drive(self, steps: Steps[T]) -> T:
        """Run a lease operation (see :class:`~celery_redislock.core.lease_state.
        Request`): each request of the holder awaited in turn, its answer sent back."""
        holder = self._holder
        try:
            request = next(steps)
            while True:
                request = steps.send(await getattr(holder, request.method)(*request.args))
        except StopIteration as stop:
            result: T = stop.value
            return result

    def _usable(self) -> bool:
        self._check_loop()
        return True

    def _check_loop(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            raise RedisLockError(
                f"lease on {self.name!r} belongs to the event loop that acquired it "
                f"({self._loop!r}); it was used from {running!r}"
            )

    def _signal_lost(self) -> None:
        event = self._lost_event
        if event is not None:
            event.set()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        was_lost = self.lost
        if self._released:
            return
        released = await self.release()
        if was_lost or not released:
            raise LockNotOwned(
                f"lease on {self.name!r} was lost before the block ended: "
                f"{self._lost_reason or 'no longer held'}",
                self.name,
                self.token,
            ) from exc

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "held"
        return f"<AsyncLease {self.name!r} fence={self.fence} {state}>"
