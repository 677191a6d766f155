"""The lease of a :class:`~.lock.RedlockLock`.

A Redlock lease is valid while a majority of the masters hold it: its local deadline
is when the majority's earliest expiry is due, less the clock-drift allowance. An
``extend()`` sends ``lock_extend.lua`` to every master at once and counts the
confirmations: a majority moves the deadline on; fewer answering "held" than a
majority could still make is a loss at once; no majority before the deadline is a
loss at the deadline. Renewal (``renew=True``) is the process's one renewer's, with
the same rules (see :mod:`.renewal`).
"""

from __future__ import annotations

import time
from typing import Protocol

from ...errors import ConfigurationError
from ..lease import Lease, current_pid
from ..renewal import renewer
from ..renewal.schedule import EARLY
from ..validate import check_bool, ttl_to_ms
from .renewal import RenewedOn

__all__ = ["Majority", "RedlockLease", "keep_alive"]


class Majority(Protocol):
    """What a lease and its renewal use of their lock, a :class:`~.lock.RedlockLock`
    (a protocol, so this module never imports the lock's, which imports it)."""

    quorum: int
    """How many masters make a majority."""

    _renewed_on: RenewedOn
    """What the renewer renews the lock's leases as."""

    def _check_ttl(self, ttl: object, argument: str) -> int:
        """``ttl`` in milliseconds, checked (and capped) as the lock takes it."""
        ...

    def _extend_all(self, token: str, ttl_ms: int, gen: int = 0) -> tuple[bool | None, float, str]:
        """Extend ``token`` on every master: ``(held by a majority?, deadline, error)``."""
        ...


class RedlockLease(Lease):
    """A :class:`~celery_redislock.Lease` held on a majority of Redlock masters.

    Same contract as the single-server lease; :attr:`fence` is the largest fence the
    granting masters gave, stored on a majority of them before ``acquire`` returned
    (see ``RedlockLock``).
    """

    __slots__ = ()

    def extend(self, ttl: float | None = None, *, add: bool = False) -> bool:
        """Reset the lease to ``ttl`` seconds (default: its TTL) on every master; with
        ``add=True``, to the time it has left (by the local deadline) plus ``ttl``.

        True when a majority confirmed in time; False (and :attr:`lost` set) when
        no majority holds it any more, or when none confirmed it before its local
        deadline: a round that too few masters answered (stalled, unreachable) is
        tried again until then, as renewal does. An expired lease is never brought
        back.
        """
        if check_bool(add, "add") and ttl is None:
            raise ConfigurationError("extend(add=True) needs ttl, the seconds to add; got None")
        if self._released or self._pid != current_pid():
            return False
        lock: Majority = self._holder  # type: ignore[assignment]
        added = None if not add else ttl_to_ms(ttl) / 1000
        ttl_ms = lock._check_ttl(self.ttl if ttl is None else ttl, "ttl")
        error = ""
        while True:
            if added is not None:
                ttl_ms = lock._check_ttl(max(0.0, self.remaining()) + added, "ttl")
            # A renewed lease: the change gets a new generation, so a renewal composed
            # before it (and still in flight) cannot undo it, and renewal goes on at
            # the new TTL from now (LeaseState's, as for the single-server lease).
            renewer, gen = self._explicit(ttl_ms / 1000)
            sent_at = time.monotonic()
            held, deadline, error = lock._extend_all(self.token, ttl_ms, gen)
            if held and self._confirmed(ttl_ms, deadline):
                self._rescheduled(renewer, sent_at)
                return True
            left = self.remaining()
            if held is False or left <= 0 or self._released:
                break
            # As renewal retries a failed call (renewal/schedule.py): soon, not at once.
            time.sleep(min(max(0.02, min(self.ttl * EARLY, 1.0)), left))
        self._mark_lost(
            f"extend found no majority of {lock.quorum} masters holding the "
            f"lease in time ({error or 'validity passed'})"
        )
        return False

    def _confirmed(self, ttl_ms: int, deadline: float) -> bool:
        """Record a majority's confirmation valid until local ``deadline``."""
        if deadline <= time.monotonic():
            return False
        self.ttl = ttl_ms / 1000.0
        self._confirm(deadline)
        return True


def keep_alive(lease: RedlockLease, lock: Majority) -> None:
    """Renew ``lease`` on every master under the process's renewer (see
    :mod:`.renewal`) until it is released, lost or collected."""
    if lease._pid != current_pid() or lease.released or lease.lost or lease._stop_renewal:
        return  # another process's lease, nothing left to renew, or renewed already
    lease._stop_renewal = renewer().add(lease, lock._renewed_on, None)
