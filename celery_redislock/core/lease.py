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
import secrets
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from ..errors import ConfigurationError, LockNotOwned
from .lease_state import EXPIRED, LeaseState, lost_lock

__all__ = ["Lease", "LeaseHolder", "OnLost", "current_pid"]

_PID = os.getpid()  # os.getpid() is a system call; a lease checks it on every operation


def _after_fork_in_child() -> None:
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    """This process's id, as ``os.getpid()``, without a system call per use."""
    return _PID


OnLost = Callable[["Lease"], None]
"""Signature of an ``on_lost`` callback: called once, with the lost lease."""


class LeaseHolder(Protocol):
    """What a lock or semaphore offers its leases (the core's internal seam)."""

    @property
    def name(self) -> str:
        """The lock or semaphore name."""
        ...

    def _release_token(self, token: str) -> bool:
        """Give up ``token`` in one round trip; False when it was no longer held."""
        ...

    def _extend_token(self, token: str, ttl_ms: int) -> bool:
        """Set ``token``'s TTL in one round trip; False when it was no longer held."""
        ...

    def _held_token(self, token: str) -> int:
        """The ms ``token`` has left on the server, 0 when not live (read-only)."""
        ...

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int:
        """Add ``ttl_ms`` to ``token``'s time left; the ms left after, 0 when not live."""
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
        self._pid = _PID
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
        if self._pid != _PID:
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
        if self._released:
            return False
        if self._pid != _PID:
            return False
        self._end_renewal()
        holder = self._holder
        # A lock on a plain client judges a re-sent release by the lease's deadline
        # (RedisLock._release_lease; none for a lease known lost already); other
        # holders answer by the token alone.
        by_lease = getattr(holder, "_release_lease", None)
        ok = (
            holder._release_token(self.token)
            if by_lease is None
            else by_lease(self.token, 0.0 if self._lost else self._deadline)
        )
        self._released = True
        if not ok:
            self._mark_lost("release found the lease no longer held")
        return ok

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
        from .validate import check_bool, ttl_to_ms

        if check_bool(add, "add"):
            if ttl is None:
                raise ConfigurationError("extend(add=True) needs ttl, the seconds to add; got None")
            return self._extend_add(ttl_to_ms(ttl))
        if self._released or self._pid != _PID:
            return False
        new_ttl = self.ttl if ttl is None else ttl
        ttl_ms = ttl_to_ms(new_ttl)
        # A renewed lease: the change gets a new generation, so a renewal composed
        # before it (and still in flight) cannot undo it, and renewal goes on at the
        # new TTL from now (not on the old schedule, maybe after the new TTL ran out).
        entry = self._stop_renewal
        renewer = getattr(entry, "renewer", None)
        gen = renewer.explicit(entry, ttl_ms / 1000.0) if renewer is not None else 0
        sent_at = time.monotonic()
        if self._holder._extend_token(self.token, ttl_ms, *((gen,) if gen else ())):
            self.ttl = ttl_ms / 1000.0
            self._confirm(sent_at + self.ttl)
            if renewer is not None:
                renewer.rescheduled(entry, sent_at, self.ttl)
            return True
        self._mark_lost("extend found the lease no longer held")
        return False

    def _extend_add(self, ttl_ms: int) -> bool:
        if self._released or self._pid != _PID:
            return False
        # A renewed lease: as for extend(), a new generation, so a renewal composed
        # before the addition (in flight) cannot cut it back; renewal goes on at about
        # the new length (the time left as this process knows it, plus ``ttl``).
        entry = self._stop_renewal
        renewer = getattr(entry, "renewer", None)
        guess = max(0.0, self.remaining()) + ttl_ms / 1000.0
        gen = renewer.explicit(entry, guess) if renewer is not None else 0
        sent_at = time.monotonic()
        left_ms = self._holder._add_to_token(self.token, ttl_ms, secrets.token_hex(8), gen)
        if left_ms > 0:
            self.ttl = left_ms / 1000.0
            self._confirm(sent_at + self.ttl)
            if renewer is not None:
                renewer.rescheduled(entry, sent_at, self.ttl)
            return True
        self._mark_lost("extend found the lease no longer held")
        return False

    def held(self) -> bool:
        """True while the lease is live on Redis (redis-py's ``Lock.owned()``).

        One read-only round trip, on the server's clock. Unlike :attr:`lost`, which
        answers from what this process last heard, it asks Redis; when the answer is
        no, the lease is marked lost (``on_lost`` runs). A released lease, or one
        inherited by a forked child, answers False without asking.
        """
        if self._released or self.lost:
            return False
        sent_at = time.monotonic()
        left_ms = self._holder._held_token(self.token)
        if left_ms > 0:
            self._confirm(sent_at + left_ms / 1000.0)
            return True
        self._mark_lost("held() found the lease no longer held")
        return False

    def hand_over(self, ttl: float) -> bool:
        """Give the lease to whoever holds its token next (e.g. another process that
        adopts it): stop renewing it, set it to expire ``ttl`` seconds from now, and
        forget it here.

        Afterwards this object neither renews, releases nor reports the lease lost
        (:attr:`released` is True). Returns False when the lease was no longer ours.
        """
        from .validate import ttl_to_ms

        ttl_ms = ttl_to_ms(ttl)
        if self._released or self._pid != _PID:
            return False
        # Renewal stops before the new TTL is set, and the change gets a new
        # generation: a renewal already composed (in flight, or queued behind other
        # scripts) cannot shorten it afterwards.
        entry = self._stop_renewal
        renewer = getattr(entry, "renewer", None)
        gen = renewer.explicit(entry, ttl_ms / 1000.0) if renewer is not None else 0
        self._mark_released()
        return bool(self._holder._extend_token(self.token, ttl_ms, *((gen,) if gen else ())))

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
        if stop is not None and self._pid == _PID:
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
