r"""``LeaseState``: what a lease knows and does, shared by the sync
:class:`~.lease.Lease` and the async ``AsyncLease``, with no I/O.

A lease keeps a local deadline on the monotonic clock: the time the confirming
request was *sent* plus the TTL it set, so it never outlives the server's expiry.
It is lost once that deadline passes unconfirmed, or once Redis answers that it is
not held; then :attr:`LeaseState.lost` is True, the subclass's event is set and
``on_lost(lease)`` runs, once. The renewers (sync and async) drive it through
:meth:`LeaseState._confirm` and :meth:`LeaseState._mark_lost`.

What a lease does -- release, extend (by replacing or adding to its TTL), ask whether
it is held, hand over -- is written once here, as generators of :class:`Request`\ s
to its holder (one round trip each); the sync lease makes each request with a call,
the async one with an ``await`` (see ``_drive`` in each).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from ..errors import ConfigurationError
from .validate import check_bool, ttl_to_ms

__all__ = [
    "EXPIRED",
    "LeaseState",
    "Named",
    "Request",
    "Steps",
    "Undecided",
    "lost_lock",
    "retry_after",
]

T = TypeVar("T")

EXPIRED = "the lease expired: its TTL passed without a renewal"
"""Loss reason when the local deadline passed."""

_LOST_LOCK = threading.Lock()  # the renewer and a user thread may both find it lost


def lost_lock() -> threading.Lock:
    """The lock that orders a loss report with the making of a lease's lost event."""
    return _LOST_LOCK


def _after_fork_in_child() -> None:
    global _LOST_LOCK
    _LOST_LOCK = threading.Lock()  # a fork while another thread held it must not deadlock


os.register_at_fork(after_in_child=_after_fork_in_child)


def retry_after(ttl: float) -> float:
    """Seconds before a lease of ``ttl`` s asks again after a call that decided
    nothing (an error, no majority): soon, not at once -- a sixth of the TTL, at
    least 20 ms, at most 1 s. Renewal's rule (``renewal/schedule.py``) and extend's."""
    return max(0.02, min(ttl / 6, 1.0))


class Undecided(NamedTuple):
    """A holder's answer to an extend that decides nothing yet: too few of a Redlock
    lock's masters answered (stalled or unreachable) to tell, and not enough of them
    said the lease is gone. The lease asks again until its deadline, as renewal does:
    a stalled moment is not a loss (#30 item 6)."""

    why: str


class Request(NamedTuple):
    """One round trip a lease asks of its holder: the holder's method and its
    arguments (sync on a sync holder, a coroutine on an async one):

    * ``_release_lease(token, deadline) -> bool``: released (False: not ours);
    * ``_extend_token(token, ttl_ms, gen) -> bool | Undecided``: TTL set (False: not
      live);
    * ``_add_to_token(token, ttl_ms, nonce, gen) -> int | Undecided``: ms left after
      (0: not live);
    * ``_held_token(token) -> int``: ms left (0: not live);
    * ``_pause(seconds) -> None``: wait before asking again; only asked of a holder
      that answered :class:`Undecided`.
    """

    method: Literal["_release_lease", "_extend_token", "_add_to_token", "_held_token", "_pause"]
    args: tuple[str | int | float, ...]


Steps = Generator[Request, Any, T]
r"""A lease operation: yields :class:`Request`\ s, is sent their answers."""


class RenewalHandle(Protocol):
    """A renewed lease's place in its renewer (``core/renewal``'s ``Entry``)."""

    def __call__(self) -> None:
        """End renewal of the lease."""

    def explicit(self, ttl: float) -> int:
        """An explicit change to ``ttl`` s is about to be sent: its generation."""
        ...

    def rescheduled(self, sent_at: float, ttl: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on ``ttl``."""


class Named(Protocol):
    """What every holder of a lease is to its :class:`LeaseState`: a named lock or
    semaphore (each lease type narrows :attr:`LeaseState.holder` to its own holder)."""

    @property
    def name(self) -> str:
        """The lock or semaphore name."""
        ...


class LeaseState:
    """Ownership of one lock or semaphore permit, identified by an unguessable token.

    Attributes:
        token: the lease's random token (``secrets``); the only proof of ownership.
        fence: an int that strictly increases with every grant of the name; pass it to
            the resource you protect so it can refuse writes from a stale holder.
        ttl: the lease time in seconds the lease was last granted or extended for.
        owner: the owner id given to ``acquire`` (e.g. a Celery task id), or None.
        on_lost: called once, with the lease, when the lease is found lost.
    """

    __slots__ = (
        "__weakref__",
        "_deadline",
        "_gen",
        "_holder",
        "_lost",
        "_lost_reason",
        "_released",
        "_stop_renewal",
        "fence",
        "on_lost",
        "owner",
        "token",
        "ttl",
    )

    def __init__(
        self,
        holder: Named,
        token: str,
        fence: int,
        ttl: float,
        *,
        owner: str | None = None,
        granted_at: float | None = None,
        on_lost: Callable[[Any], None] | None = None,
    ) -> None:
        self._holder = holder
        self.token = token
        self.fence = fence
        self.ttl = ttl
        self.owner = owner
        self.on_lost = on_lost
        # The local deadline counts from *before* the request was sent, so it never
        # outlives the server's own expiry.
        start = time.monotonic() if granted_at is None else granted_at
        self._deadline = start + ttl
        self._lost = False
        self._lost_reason = ""
        self._released = False
        # Bumped by each explicit TTL change of a renewed lease (extend, hand_over) and
        # sent with it and with every renewal: Redis ignores a renewal composed before
        # the latest explicit change (renewal never undoes an explicit TTL).
        self._gen = 0
        # Set by the renewer; called once when the lease is given back, *before* the
        # release is sent, so renewal never outlives release.
        self._stop_renewal: RenewalHandle | None = None

    @property
    def name(self) -> str:
        """The name of the lock or semaphore this lease holds."""
        return str(self._holder.name)

    @property
    def holder(self) -> Named:
        """The lock or semaphore that granted this lease."""
        return self._holder

    @property
    def lost(self) -> bool:
        """True once the lease is known not to be ours (expired, taken over)."""
        if not self._lost and not self._released and time.monotonic() >= self._deadline:
            self._mark_lost(EXPIRED)
        return self._lost

    @property
    def lost_reason(self) -> str:
        """Why the lease was found lost ('' while it is not)."""
        return self._lost_reason

    @property
    def released(self) -> bool:
        """True once ``release()`` gave the lease back."""
        return self._released

    @property
    def deadline(self) -> float:
        """Local ``time.monotonic()`` instant after which the lease may have expired."""
        return self._deadline

    def remaining(self) -> float:
        """Seconds left before the local deadline (negative once passed)."""
        return self._deadline - time.monotonic()

    # -- used by the locks, the semaphores and the renewers ----------------------------

    def _confirm(self, deadline: float) -> None:
        """Record a reply that confirmed ownership until local ``deadline``."""
        if not self._lost:
            self._deadline = deadline

    def _mark_lost(self, reason: str) -> None:
        """Flag the lease lost once: signal it (the subclass's event) and run ``on_lost``."""
        with _LOST_LOCK:
            if self._lost:
                return
            self._lost = True
            self._lost_reason = reason
        self._signal_lost()
        callback = self.on_lost
        if callback is not None:
            callback(self)

    # -- what a lease does, once for the sync and the async lease (see Request) --------

    def _usable(self) -> bool:
        """True when this process (and loop) may use the lease; the subclass says."""
        return True

    def _release_steps(self) -> Steps[bool]:
        if self._released or not self._usable():
            return False
        self._end_renewal()
        # A lease known lost already is never judged released by a re-send that finds
        # it gone (a lock judges a re-sent release by the deadline: none given here).
        ok = yield Request("_release_lease", (self.token, 0.0 if self._lost else self._deadline))
        self._released = True
        if not ok:
            self._mark_lost("release found the lease no longer held")
        return bool(ok)

    def _extend_steps(self, ttl: float | None, add: bool) -> Steps[bool]:
        if check_bool(add, "add"):
            if ttl is None:
                raise ConfigurationError("extend(add=True) needs ttl, the seconds to add; got None")
            ttl_ms = ttl_to_ms(ttl)
            if self._released or not self._usable():
                return False
            total = max(0.0, self.remaining()) + ttl_ms / 1000.0
            self._ttl_ms(total)  # the holder's rule for the TTL it comes to (max_ttl)
            # A renewed lease: as for a replaced TTL (below), a new generation; renewal
            # goes on at about the new length (the time left as known here, plus ttl).
            renewer, gen = self._explicit(total)
            nonce = secrets.token_hex(8)  # the same when asked again: added once
            left_ms, sent_at = yield from self._decided(
                Request("_add_to_token", (self.token, ttl_ms, nonce, gen))
            )
            if left_ms is None:
                return False
            return self._extended(sent_at, int(left_ms) / 1000.0, renewer)
        ttl_ms = self._ttl_ms(self.ttl if ttl is None else ttl)
        if self._released or not self._usable():
            return False
        # A renewed lease: the change gets a new generation, so a renewal composed
        # before it (and still in flight) cannot undo it, and renewal goes on at the
        # new TTL from now (not on the old schedule, maybe after the new TTL ran out).
        renewer, gen = self._explicit(ttl_ms / 1000.0)
        ok, sent_at = yield from self._decided(
            Request("_extend_token", self._ttl_args(ttl_ms, gen))
        )
        if ok is None:
            return False
        return self._extended(sent_at, ttl_ms / 1000.0 if ok else 0.0, renewer)

    def _decided(self, request: Request) -> Steps[tuple[Any, float]]:
        """``request``'s answer and when (``time.monotonic()``) the call that gave it
        was sent; asked again, after :func:`retry_after`, while the holder answers
        :class:`Undecided`. None as the answer, and the lease marked lost, when its
        deadline passes first (or it was released meanwhile). The send of the
        answered call, not the first: what it confirmed counts from then."""
        sent_at = time.monotonic()
        answer = yield request
        while isinstance(answer, Undecided):
            left = self.remaining()
            if left <= 0 or self._released:
                self._mark_lost(f"extend: nothing confirmed the lease in time ({answer.why})")
                return None, sent_at
            yield Request("_pause", (min(retry_after(self.ttl), left),))
            sent_at = time.monotonic()
            answer = yield request
        return answer, sent_at

    def _ttl_ms(self, ttl: object) -> int:
        """``ttl`` (seconds) as the ms an extend sets, checked; a holder with a
        longest lease (Redlock's ``max_ttl``) applies its rule (see the subclass)."""
        return ttl_to_ms(ttl)

    def _allowance(self, ttl: float) -> float:
        """Seconds taken off a confirmed ``ttl`` for the local deadline: none on one
        server; a Redlock's clock-drift allowance (see the subclass)."""
        return 0.0

    def _extended(self, sent_at: float, ttl: float, renewer: RenewalHandle | None) -> bool:
        """An extend sent at ``sent_at`` left the lease ``ttl`` s (0: not live).

        True only for a lease held now with time left by this process's clock: a reply
        that arrives after the deadline it sets (``sent_at`` plus ``ttl``, less a
        Redlock's drift allowance) confirms nothing -- the TTL may have run out on the
        server before it answered, or since -- so it is a loss, as for a lease found
        gone, never True with a deadline already past. Redlock's validity rule for a
        majority's confirmation is this one (e21b41d), as for a grant."""
        if ttl <= 0:
            self._mark_lost("extend found the lease no longer held")
            return False
        deadline = sent_at + ttl - self._allowance(ttl)
        late = time.monotonic() - deadline
        if late >= 0:
            self._mark_lost(f"extend: confirmed {late:.3f}s after the TTL it set ran out")
            return False
        self.ttl = ttl
        self._confirm(deadline)
        self._rescheduled(renewer, sent_at)
        return True

    def _held_steps(self) -> Steps[bool]:
        if self._released or self.lost:
            return False
        sent_at = time.monotonic()
        left_ms = yield Request("_held_token", (self.token,))
        if left_ms > 0:
            self._confirm(sent_at + left_ms / 1000.0)
            return True
        self._mark_lost("held() found the lease no longer held")
        return False

    def _hand_over_steps(self, ttl: float) -> Steps[bool]:
        ttl_ms = self._ttl_ms(ttl)
        if self._released or not self._usable():
            return False
        # Renewal stops before the new TTL is set, and the change gets a new
        # generation: a renewal already composed (in flight, or queued behind other
        # scripts) cannot shorten it afterwards.
        _renewer, gen = self._explicit(ttl_ms / 1000.0)
        self._mark_released()
        answer = yield Request("_extend_token", self._ttl_args(ttl_ms, gen))
        return not isinstance(answer, Undecided) and bool(answer)  # not asked again

    def _ttl_args(self, ttl_ms: int, gen: int) -> tuple[str | int, ...]:
        """``_extend_token``'s arguments; the generation only when there is one (a
        holder that renews its leases itself takes none)."""
        return (self.token, ttl_ms, gen) if gen else (self.token, ttl_ms)

    def _explicit(self, ttl: float) -> tuple[RenewalHandle | None, int]:
        """An explicit TTL change to ``ttl`` s is about to be sent: this lease's place
        in its renewer (or None) and the change's generation (0 when not renewed), so
        a renewal composed before it cannot undo it (see ``Schedule.explicit``)."""
        entry = self._stop_renewal
        return entry, entry.explicit(ttl) if entry is not None else 0

    def _rescheduled(self, renewer: RenewalHandle | None, sent_at: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on the new TTL."""
        if renewer is not None:
            renewer.rescheduled(sent_at, self.ttl)

    def _signal_lost(self) -> None:
        """Set the subclass's lost event, if it made one."""

    def _mark_released(self) -> None:
        """Record that the lease was given back by its holder (e.g. a re-entrant exit)."""
        self._end_renewal()
        self._released = True

    def _end_renewal(self) -> None:
        """Stop background renewal of this lease, if any (once)."""
        stop, self._stop_renewal = self._stop_renewal, None
        if stop is not None:
            stop()
