"""The lease of a :class:`~.lock.RedlockLock`.

A Redlock lease is valid while a majority of the masters hold it: its local deadline
is when the majority's earliest expiry is due, less the clock-drift allowance. What
it does -- release, extend (replacing or adding to its TTL), held, hand over -- is
the single-server lease's own (:class:`~..lease_state.LeaseState`); its lock answers
each request by running the single-server operation on every master at once and
counting the majority (``RedlockLock._extend_token`` etc.). An extend that too few
masters answered to decide is asked again until the lease's deadline, as renewal
does; one that fewer than a majority can still hold is a loss at once. Renewal
(``renew=True``) is the process's one renewer's, with the same rules (see
:mod:`.renewal`).
"""

from __future__ import annotations

from typing import Protocol

from ..lease import Lease, LeaseHolder, current_pid
from ..renewal import renewer
from .renewal import RenewedOn

__all__ = ["Majority", "RedlockLease", "keep_alive"]


class Majority(LeaseHolder, Protocol):
    """What a lease and its renewal use of their lock, a :class:`~.lock.RedlockLock`
    (a protocol, so this module never imports the lock's, which imports it)."""

    quorum: int
    """How many masters make a majority."""

    _renewed_on: RenewedOn
    """What the renewer renews the lock's leases as."""

    def _check_ttl(self, ttl: object, argument: str) -> int:
        """``ttl`` in milliseconds, checked (and capped) as the lock takes it."""
        ...

    def _drift_s(self, ttl_ms: int) -> float:
        """The clock-drift allowance (seconds) taken off a lease of ``ttl_ms``."""
        ...


class RedlockLease(Lease):
    """A :class:`~celery_redislock.Lease` held on a majority of Redlock masters.

    Same contract as the single-server lease; :attr:`fence` is the largest fence the
    granting masters gave, stored on a majority of them before ``acquire`` returned
    (see ``RedlockLock``). ``extend()`` returns False (and sets :attr:`lost`) only
    when no majority holds the lease any more, or when none confirmed it before its
    local deadline; an expired lease is never brought back.
    """

    __slots__ = ()

    _holder: Majority

    def _ttl_ms(self, ttl: object) -> int:
        return self._holder._check_ttl(ttl, "ttl")  # max_ttl: refused (or cut)

    def _allowance(self, ttl: float) -> float:
        return self._holder._drift_s(round(ttl * 1000))


def keep_alive(lease: RedlockLease, lock: Majority) -> None:
    """Renew ``lease`` on every master under the process's renewer (see
    :mod:`.renewal`) until it is released, lost or collected."""
    if lease._pid != current_pid() or lease.released or lease.lost or lease._stop_renewal:
        return  # another process's lease, nothing left to renew, or renewed already
    lease._stop_renewal = renewer().add(lease, lock._renewed_on, None)
