"""The lease of a :class:`~.lock.RedlockLock`, and its renewal.

A Redlock lease is valid while a majority of the masters hold it: its local deadline
is when the majority's earliest expiry is due, less the clock-drift allowance. An
``extend()`` or a renewal sends ``lock_extend.lua`` to every master at once and
counts the confirmations: a majority moves the deadline on; fewer answering "held"
than a majority could still make is a loss at once; no majority before the deadline
is a loss at the deadline.

Renewal (``renew=True``) is one daemon thread per renewed lease, renewing every
TTL/3 and retrying failed rounds until the deadline. Redlock leases are few (one
per singleton task at most), and a thread of its own keeps a stopped master from
delaying any other lease's loss report.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Protocol

from ...errors import ConfigurationError
from ..lease import Lease, current_pid
from ..renewal.entry import report
from ..renewal.schedule import EARLY
from ..validate import check_bool, ttl_to_ms

__all__ = ["Majority", "RedlockLease", "keep_alive"]

log = logging.getLogger(__name__)


class Majority(Protocol):
    """What a lease and its renewal use of their lock, a :class:`~.lock.RedlockLock`
    (a protocol, so this module never imports the lock's, which imports it)."""

    quorum: int
    """How many masters make a majority."""

    def _check_ttl(self, ttl: object, argument: str) -> int:
        """``ttl`` in milliseconds, checked (and capped) as the lock takes it."""
        ...

    def _extend_all(self, token: str, ttl_ms: int) -> tuple[bool | None, float, str]:
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
        if added is None:
            ttl_ms = lock._check_ttl(self.ttl if ttl is None else ttl, "ttl")
        while True:
            if added is not None:
                ttl_ms = lock._check_ttl(max(0.0, self.remaining()) + added, "ttl")
            held, deadline, error = lock._extend_all(self.token, ttl_ms)
            if held and self._confirmed(ttl_ms, deadline):
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
    """Renew ``lease`` on every master from a thread of its own until it is
    released, lost or collected."""
    stop = threading.Event()
    lease._stop_renewal = stop.set
    thread = threading.Thread(
        target=_renew,
        args=(weakref.ref(lease), lock, stop),
        daemon=True,
        name=f"celery-redislock-redlock-renewal-{lease.name}",
    )
    thread.start()


def _renew(ref: weakref.ref[RedlockLease], lock: Majority, stop: threading.Event) -> None:
    error = ""
    while True:
        lease = ref()
        if lease is None or lease.released or lease._lost:
            return
        ttl = lease.ttl
        ttl_ms = ttl_to_ms(ttl)
        due = lease.deadline - ttl * 2 / 3  # a third of the TTL after the last grant
        wait = min(max(0.0, due - time.monotonic()), max(0.0, lease.remaining()))
        del lease  # never keep the lease alive while asleep
        if stop.wait(wait):
            return
        lease = ref()
        if lease is None or lease.released or lease._lost:
            return
        if time.monotonic() >= lease.deadline:
            report(
                [
                    (
                        lease,
                        f"no majority of {lock.quorum} masters confirmed the lease "
                        f"before its deadline (last error: {error or 'none'})",
                    )
                ]
            )
            return
        held, deadline, error = lock._extend_all(lease.token, ttl_ms)
        if stop.is_set():
            return  # released meanwhile: the release decides
        if held and lease._confirmed(ttl_ms, deadline):
            continue
        if held is False:
            report(
                [
                    (
                        lease,
                        f"renewal found fewer than {lock.quorum} masters that could "
                        f"still hold the lease ({error})",
                    )
                ]
            )
            return
        # No majority answered (masters down or slow): try again soon, until the deadline.
        log.debug("celery_redislock: Redlock renewal of %r failed: %s", lease.name, error)
        if stop.wait(min(max(0.02, ttl / 10), max(0.0, lease.remaining()))):
            return
