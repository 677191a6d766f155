"""``Lease``: the proof of ownership that ``acquire`` returns.

A lease never raises for being lost: ``release()`` and ``extend()`` answer False and
set :attr:`Lease.lost`. Only leaving a ``with`` block whose lease was lost raises
:class:`~celery_redislock.errors.LockNotOwned`, so a broken critical section is
never silent.

Fork safety: a lease belongs to the process that acquired it. In a forked child
(Celery's prefork pool) the inherited object reports itself lost and never touches
Redis, so a child can neither release nor extend its parent's lock.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar

from ..errors import LockNotOwned
from .lease_state import EXPIRED, LeaseState, Steps, Undecided, lost_lock

__all__ = ["Lease", "LeaseHolder", "OnLost", "current_pid"]

T = TypeVar("T")


def current_pid() -> int:
    """This process's id (``os.getpid()``): a lease belongs to the process that
    acquired it."""
    return os.getpid()


OnLost = Callable[["Lease"], None]
"""Signature of an ``on_lost`` callback: called once, with the lost lease."""


class LeaseHolder(Protocol):
    """What a lock or semaphore offers its leases (the core's internal seam)."""

    @property
    def name(self) -> str:
        """The lock or semaphore name."""
        ...

    def _release_lease(self, token: str, deadline: float) -> bool:
        """Give up ``token`` (its local deadline ``deadline``) in one round trip; False
        when it was no longer held."""
        ...

    def _extend_token(self, token: str, ttl_ms: int) -> bool | Undecided:
        """Set ``token``'s TTL in one round trip; False when it was no longer held
        (:class:`~.lease_state.Undecided`: a Redlock could not tell yet)."""
        ...

    def _held_token(self, token: str) -> int:
        """The ms ``token`` has left on the server, 0 when not live (read-only)."""
        ...

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int | Undecided:
        """Add ``ttl_ms`` to ``token``'s time left; the ms left after, 0 when not live
        (:class:`~.lease_state.Undecided`: a Redlock could not tell yet)."""
        ...


class Lease(LeaseState):
    """Ownership of one lock or semaphore permit, identified by an unguessable token
    (see :class:`~.lease_state.LeaseState` for its attributes).

    Its holder's calls are sync; it belongs to the process that acquired it.
    """

    __slots__ = ("_lost_event", "_pid")

    _holder: LeaseHolder

    def __init__(
        self,
        holder: LeaseHolder,
        token: str,
        fence: int,
        ttl: float,
        *,
        owner: str | None = None,
        granted_at: float | None = None,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> None:
        super().__init__(
            holder, token, fence, ttl, owner=owner, granted_at=granted_at, on_lost=on_lost
        )
        self._pid = os.getpid()
        # Made on first use: most leases are never waited on, and an Event costs
        # about as much as the rest of a lease (see benchmarks/bench_lock.py).
        self._lost_event: threading.Event | None = None

    @property
    def holder(self) -> LeaseHolder:
        """The lock or semaphore that granted this lease."""
        return self._holder

    @property
    def lost(self) -> bool:
        """True once the lease is known not to be ours (expired, taken, other process)."""
        if self._pid != os.getpid():
            return True
        if not self._lost and not self._released and time.monotonic() >= self._deadline:
            self._mark_lost(EXPIRED)
        return self._lost

    @property
    def lost_event(self) -> threading.Event:
        """An event set when the lease is found lost; user code may ``wait()`` on it."""
        event = self._lost_event
        if event is None:
            with lost_lock():  # one event, and set if the lease was lost meanwhile
                if self._lost_event is None:
                    self._lost_event = threading.Event()
                    if self._lost:
                        self._lost_event.set()
                event = self._lost_event
        return event

    def release(self) -> bool:
        """Give the lease back; False (and :attr:`lost` set) when it was no longer ours."""
        return self._drive(self._release_steps())

    def extend(self, ttl: float | None = None, *, add: bool = False) -> bool:
        """Reset the lease to ``ttl`` seconds (default: its current TTL) from now, or,
        with ``add=True``, add ``ttl`` seconds to the time it has left.

        Without ``add`` the TTL is *replaced*: ``extend(5)`` on a lease with 20 s left
        leaves it 5 s (redis-py's ``Lock.extend(5)`` would leave 25 s; its
        ``replace_ttl=True`` is this default). ``add=True`` is redis-py's behaviour, in
        one script on the server's clock; a request re-sent after a lost reply adds
        once. Returns False, and sets :attr:`lost`, when the lease is no longer ours;
        an expired lease is never brought back.
        """
        return self._drive(self._extend_steps(ttl, add))

    def held(self) -> bool:
        """True while the lease is live on Redis (redis-py's ``Lock.owned()``).

        One read-only round trip, on the server's clock. Unlike :attr:`lost`, which
        answers from what this process last heard, it asks Redis; when the answer is
        no, the lease is marked lost (``on_lost`` runs). A released lease, or one
        inherited by a forked child, answers False without asking.
        """
        return self._drive(self._held_steps())

    def hand_over(self, ttl: float) -> bool:
        """Give the lease to whoever holds its token next (e.g. another process that
        adopts it): stop renewing it, set it to expire ``ttl`` seconds from now, and
        forget it here.

        Afterwards this object neither renews, releases nor reports the lease lost
        (:attr:`released` is True). Returns False when the lease was no longer ours.
        """
        return self._drive(self._hand_over_steps(ttl))

    def _drive(self, steps: Steps[T]) -> T:
        """Run a lease operation (see :class:`~.lease_state.Request`): each request
        made of the holder in turn, its answer sent back."""
        holder = self._holder
        try:
            request = next(steps)
            while True:
                request = steps.send(getattr(holder, request.method)(*request.args))
        except StopIteration as stop:
            result: T = stop.value
            return result

    def _usable(self) -> bool:
        return self._pid == os.getpid()

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is found lost or ``timeout`` passes; return :attr:`lost`."""
        event = self.lost_event
        event.wait(timeout)
        return event.is_set()

    # -- used by the lock, the semaphore and the renewer ---------------------------

    def _signal_lost(self) -> None:
        event = self._lost_event
        if event is not None:
            event.set()

    def _end_renewal(self) -> None:
        """Stop background renewal of this lease, if any (once; never in a forked child,
        where the parent's renewer does not exist)."""
        stop, self._stop_renewal = self._stop_renewal, None
        if stop is not None and self._pid == os.getpid():
            stop()

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        was_lost = self.lost
        if self._released:
            return
        released = self.release()
        if was_lost or not released:
            raise LockNotOwned(
                f"lease on {self.name!r} was lost before the block ended: "
                f"{self._lost_reason or 'no longer held'}",
                self.name,
                self.token,
            ) from exc

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "held"
        return f"<Lease {self.name!r} fence={self.fence} {state}>"
