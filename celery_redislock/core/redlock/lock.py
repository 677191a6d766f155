"""``RedlockLock``: one lock over N independent Redis masters, granted by a majority.

Each operation runs the single-server lock's script on every master at once (see
:mod:`.masters`, :mod:`.rounds`). A lease is granted when a majority granted it
within its validity (TTL - time taken - drift allowance); otherwise what was
granted is given back on every master that granted or did not answer.

Fences: each master proposes max(its last fence + 1, its µs clock, the client's
proposal: its µs clock + 1 s, or the fence a release handed this waiter when that is
higher); the lease's fence is the largest, and before ``acquire`` returns it is stored
on a majority: the granting masters whose own fence was lower have their counters
raised to it (``redlock_floor.lua``), waited for only as far as a majority needs.
Any later majority shares a master with it, which grants only higher fences, so
fences strictly increase as long as no master of that majority lost its data. A
master that restarted without its data refuses grants for ``max_ttl`` after its
start (its boot marker, a key named after its run id, is missing), so no lease it
forgot can still be live when it grants again; fences then stay ordered by the
clocks, which have moved on by ``max_ttl`` (assumed: masters' clocks differ by less
than that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from redis import Redis
from redis.typing import EncodableT, KeyT

from ...errors import ConfigurationError, RedlockUnavailable
from ..info import PrimitiveInfo
from ..keys import DEFAULT_PREFIX
from ..lease import OnLost
from ..lease_state import Undecided
from ..lock import RedisLock
from ..lock_scripts import LockScripts
from ..primitive import Primitive, fresh_token
from ..validate import acquire_deadline, check_bool, ttl_to_ms
from . import rounds
from .fanout import drive
from .lease import RedlockLease, keep_alive
from .masters import Call, Master, check_masters
from .renewal import MasterSet, RenewedOn
from .wait import wait_for_lease

__all__ = ["FENCE_LEAD_US", "RedlockLock"]

FENCE_LEAD_US = 1_000_000
"""How far ahead of its own clock (µs) a client proposes the next fence: when it is
above every master's own proposal, they all grant this same fence and no floor needs
raising (one round trip)."""


class RedlockLock(Primitive):
    """A lock held by a majority of N >= 3 (odd) independent Redis masters.

    Same contract as :class:`~celery_redislock.RedisLock` (``acquire``, ``with``,
    :class:`~celery_redislock.Lease` with ``release``/``extend``/``lost``, renewal).

    Args:
        clients: ``redis.Redis`` clients of independent masters (not replicas of one
            another), an odd number of at least 3, each a different server.
        name: the lock's name; the same keys as a ``RedisLock`` on each master.
        ttl: lease time in seconds.
        max_ttl: the longest lease any client of these masters takes (default:
            ``ttl``): a master that restarted without its data grants nothing for
            this long after its start. Larger TTLs are refused.
        drift: clock-drift allowance as a fraction of the TTL (plus 2 ms) taken off
            every lease's validity.
        master_timeout: seconds a round waits for the masters' replies (default
            min(0.5, ttl / 5)); a master slower than this counts as not answering.
        retry_jitter: most seconds added at random before retrying after a split
            round (grants on fewer than a majority), so contenders spread out.
        renew: renew leases in the background (every master, every TTL/3).
    """

    kind = "lock"

    def __init__(
        self,
        clients: list[Redis],
        name: str,
        *,
        ttl: float = 30.0,
        prefix: str = DEFAULT_PREFIX,
        renew: bool = False,
        max_ttl: float | None = None,
        drift: float = 0.01,
        master_timeout: float | None = None,
        retry_jitter: float = 0.05,
    ) -> None:
        self._masters: list[Master] = check_masters(clients)
        super().__init__(
            self._masters[0].client,
            name,
            ttl=ttl,
            prefix=prefix,
            renew=check_bool(renew, "renew"),
            max_hold=None,
        )
        self.quorum = len(self._masters) // 2 + 1
        self._max_ttl_ms = self._ttl_ms if max_ttl is None else ttl_to_ms(max_ttl, "max_ttl")
        if self._ttl_ms > self._max_ttl_ms:
            raise ConfigurationError(f"ttl must be <= max_ttl ({max_ttl!r}), got {ttl!r}")
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 0 <= drift < 0.5:
            raise ConfigurationError(f"drift must be a fraction >= 0 and < 0.5, got {drift!r}")
        self._drift = float(drift)
        self._timeout = (
            min(0.5, self._ttl_ms / 5000)
            if master_timeout is None
            else ttl_to_ms(master_timeout, "master_timeout") / 1000
        )
        if (
            isinstance(retry_jitter, bool)
            or not isinstance(retry_jitter, (int, float))
            or not (0 <= retry_jitter < math.inf)
        ):
            raise ConfigurationError(f"retry_jitter must be seconds >= 0, got {retry_jitter!r}")
        self._jitter = float(retry_jitter)
        self._scripts = LockScripts(self._masters[0].client, self._keys)
        self._boot_prefix = f"{prefix}:redlock:boot:"
        self._renewed_on = RenewedOn(
            MasterSet.of(self._masters), self._keys.holders, self._timeout, self._drift_s
        )

    @property
    def masters(self) -> list[str]:
        """``host:port`` of each master, in the order given."""
        return [master.label for master in self._masters]

    @property
    def clients(self) -> list[Redis]:
        """The masters' clients, in the order given."""
        return [master.client for master in self._masters]

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> RedlockLease | None:
        """Take the lock on a majority; return the lease, or None if not granted in time.

        ``blocking=False`` (or ``timeout=0``) tries once. Otherwise retries until
        ``timeout`` (None: for ever), woken by the masters' releases, with jitter.
        Raises :class:`~celery_redislock.errors.RedlockUnavailable` when fewer than a
        majority of masters answered (the last attempt, at the deadline).
        ``max_hold`` is not offered on Redlock (ConfigurationError when given).
        """
        if max_hold is not None:
            raise ConfigurationError(f"max_hold is not supported by RedlockLock, got {max_hold!r}")
        deadline = acquire_deadline(blocking, timeout)
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigurationError(f"owner must be a non-empty string or None, got {owner!r}")
        ttl_ms = self._ttl_ms if ttl is None else self._check_ttl(ttl, "ttl")
        token, tag = fresh_token()
        if deadline is None:
            lease, outcome = self._try(token, owner, ttl_ms)
            if lease is None and outcome.answered < self.quorum:
                raise self._unavailable(outcome)
        else:
            lease = wait_for_lease(self, token, tag, owner, ttl_ms, deadline)
        return None if lease is None else self._started(lease, renew, on_lost)

    def try_acquire(
        self,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> tuple[RedlockLease | None, str | None]:
        """One attempt that never waits: ``(lease, None)``, or ``(None, owner_id)`` of
        the holder a refusing master named (None when none). Raises
        ``RedlockUnavailable`` when fewer than a majority answered."""
        ttl_ms = self._ttl_ms if ttl is None else self._check_ttl(ttl, "ttl")
        lease, outcome = self._try(fresh_token()[0], owner, ttl_ms)
        if lease is None:
            if outcome.answered < self.quorum:
                raise self._unavailable(outcome)
            return None, outcome.holder()
        return self._started(lease, renew, on_lost), None

    def adopt(
        self,
        token: str,
        *,
        new_token: str | None = None,
        owner: str | None = None,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> RedlockLease | None:
        """Take over the live lease ``token`` on a majority (as ``RedisLock.adopt``);
        None when fewer than a majority could hand it over."""
        ttl_ms = self._ttl_ms if ttl is None else self._check_ttl(ttl, "ttl")
        new_token = new_token or fresh_token()[0]
        scripts = self._scripts
        grants, adopted = rounds.adopt(
            self._masters,
            lambda: scripts.adopt(token, new_token, ttl_ms, owner),
            self.quorum,
            self._timeout,
        )
        # Valid from the majority's earliest start (each grant counts from when its
        # request was sent, or from what the lease had left), less the drift allowance.
        valid_until = (
            grants[self.quorum - 1][1] + ttl_ms / 1000 - self._drift_s(ttl_ms)
            if len(grants) >= self.quorum
            else 0.0
        )
        if valid_until <= time.monotonic():
            rounds.run(self._masters, adopted, lambda: scripts.release(new_token), self._timeout)
            return None
        fence = max(fence for fence, _ in grants)
        lease = RedlockLease(
            self,
            new_token,
            fence,
            ttl_ms / 1000,
            owner=owner,
            granted_at=valid_until - ttl_ms / 1000,
        )
        return self._started(lease, renew, on_lost)

    def _acquire_call(self, token: str, args: list[EncodableT]) -> Call:
        """``lock_acquire.lua`` with ARGV ``[token, *args]``; its last KEY is the boot
        marker of the master's server, named after its run id (see the module docs)."""
        keys = self._scripts.acquire_keys
        boot = f"{self._boot_prefix}{{}}:{self._max_ttl_ms}"

        def keys_for(run_id: str) -> list[KeyT]:
            return [*keys, boot.format(run_id)]

        return Call(rounds.ACQUIRE, keys, [token, *args], keys_for)

    def _started(
        self, lease: RedlockLease, renew: bool | None, on_lost: OnLost | None
    ) -> RedlockLease:
        lease.on_lost = on_lost
        if self.renew if renew is None else renew:
            keep_alive(lease, self)
        return lease

    def _check_ttl(self, ttl: object, argument: str) -> int:
        ttl_ms = ttl_to_ms(ttl, argument)
        if ttl_ms > self._max_ttl_ms:
            raise ConfigurationError(
                f"{argument} must be <= max_ttl ({self._max_ttl_ms / 1000}s: the restart "
                f"grace of the masters), got {ttl!r}"
            )
        return ttl_ms

    def _drift_s(self, ttl_ms: int) -> float:
        return ttl_ms * self._drift / 1000 + 0.002

    def _try(
        self,
        token: str,
        owner: str | None,
        ttl_ms: int,
        ticket: int = 0,
        give_back: bool = True,
        floor: int = 0,
    ) -> tuple[RedlockLease | None, rounds.Round]:
        """One round; the lease when a majority granted in time, else everything
        granted (or possibly granted) given back (unless ``give_back`` is False: the
        next round asks with the same token, and finds them). With a ``ticket`` (µs),
        a refused attempt queues with that place on every master."""
        now_us = time.time_ns() // 1000
        if floor <= now_us:  # no fence handed over, or one behind this clock
            floor = now_us + FENCE_LEAD_US
        args: list[EncodableT] = [
            ttl_ms,
            owner or "",
            b"1" if ticket else b"0",
            floor,
            self._max_ttl_ms,
        ]
        if ticket:
            args.append(ticket)
        outcome = rounds.attempt(
            self._masters, self._acquire_call(token, args), ttl_ms, self._timeout
        )
        grants = outcome.grants
        if len(grants) >= self.quorum:
            fence = max(granted for granted, _ in grants.values())
            stored = rounds.raise_floors(
                self._masters, self._scripts.acquire_keys[1], grants, fence, self._timeout
            )
            expiries = sorted((start for _, start in grants.values()), reverse=True)
            valid_until = expiries[self.quorum - 1] + ttl_ms / 1000 - self._drift_s(ttl_ms)
            if stored >= self.quorum and valid_until > time.monotonic():
                lease = RedlockLease(
                    self,
                    token,
                    fence,
                    ttl_ms / 1000,
                    owner=owner,
                    granted_at=valid_until - ttl_ms / 1000,
                )
                return lease, outcome
        if give_back and (grants or outcome.errors or outcome.late):
            rounds.run(
                self._masters,
                sorted({*grants, *outcome.errors, *outcome.late}),
                lambda: self._scripts.release(token),
                self._timeout,
            )
        return None, outcome

    def _unavailable(self, outcome: rounds.Round) -> RedlockUnavailable:
        return RedlockUnavailable(
            f"Redlock {self.name!r}: only {outcome.answered} of {len(self._masters)} masters "
            f"answered, {self.quorum} needed: {rounds.errors_text(self._masters, outcome.errors)}"
        )

    def __repr__(self) -> str:
        return f"<RedlockLock {self.name!r} ttl={self.ttl} masters={self.masters}>"

    # -- for operators and tools -------------------------------------------------------

    def _release_owner(self, owner: str) -> int:
        """``release_owner``/``force_release`` on every master: the number of masters
        where leases were released."""
        released = rounds.run(
            self._masters,
            list(range(len(self._masters))),
            lambda: self._scripts.release_owner(owner),
            self._timeout,
        )
        return sum(1 for count in released.values() if isinstance(count, int) and count > 0)

    def locked(self) -> bool:
        """True while a majority of the masters hold the lock."""
        views = self.info_by_master().values()
        held = sum(1 for info in views if isinstance(info, PrimitiveInfo) and info.holders)
        return held >= self.quorum

    def info_by_master(self) -> dict[str, PrimitiveInfo | Exception]:
        """Each master's view of the lock (``host:port`` -> its info, or the error)."""
        views: dict[str, PrimitiveInfo | Exception] = {}
        for master in self._masters:
            try:
                views[master.label] = RedisLock(
                    master.client, self.name, prefix=self._keys.prefix
                ).info()
            except Exception as exc:  # a master down is part of the picture
                views[master.label] = exc
        return views

    # -- the lease's side --------------------------------------------------------------

    def _release_token(self, token: str) -> bool:
        # No release record (a deadline given): a fan-out never re-sends, none needs
        # the first answer.
        released = drive(
            self._masters,
            lambda: self._scripts.release(token, 0.0),
            self._timeout,
            (self.quorum, rounds.confirmed),
        )
        return released.count(True) >= self.quorum

    def _extend_token(self, token: str, ttl_ms: int, gen: int = 0) -> bool | Undecided:
        """A lease's extend (or hand-over) on every master at once
        (``LockScripts.extend``): True when a majority set the TTL, False when fewer
        than a majority can still hold the lease, else :class:`Undecided` (the lease
        asks again until its deadline)."""
        ttl_ms = self._check_ttl(ttl_ms / 1000, "ttl")  # also for a token-only extend
        replies = drive(
            self._masters,
            lambda: self._scripts.extend(token, ttl_ms, gen),
            self._timeout,
            (self.quorum, rounds.confirmed),
        )
        outcome = rounds.verdict(replies, self.quorum, rounds.confirmed)
        return self._undecided(replies) if outcome == "unknown" else outcome == "held"

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int | Undecided:
        """A lease's ``extend(add=True)`` on every master at once
        (``LockScripts.extend_add``, each master's time left capped at ``max_ttl``;
        a round asked again carries the same nonce and adds once): the ms a majority
        has left (the least of the majority's), 0 when fewer than a majority can
        still hold the lease, else :class:`Undecided`."""
        replies = drive(
            self._masters,
            lambda: self._scripts.extend_add(token, ttl_ms, nonce, gen, self._max_ttl_ms),
            self._timeout,
            (self.quorum, _positive),
        )
        outcome = rounds.verdict(replies, self.quorum, _positive)
        if outcome == "held":
            lefts = sorted((r for r in replies if isinstance(r, int) and r > 0), reverse=True)
            return lefts[self.quorum - 1]
        return 0 if outcome == "gone" else self._undecided(replies)

    def _undecided(self, replies: Sequence[object]) -> Undecided:
        errors = {i: r for i, r in enumerate(replies) if isinstance(r, BaseException)}
        return Undecided(
            f"no majority of {self.quorum} of {len(self._masters)} masters answered: "
            f"{rounds.errors_text(self._masters, errors) or 'no answer in time'}"
        )

    def _pause(self, seconds: float) -> None:
        """Wait before a lease asks again after :class:`Undecided`."""
        time.sleep(seconds)

    def _held_token(self, token: str) -> int:
        """The ms ``token``'s lease has left on a majority (less the drift allowance),
        0 when fewer than a majority can still hold it (``Lease.held``); raises
        ``RedlockUnavailable`` when too few masters answered to tell."""
        replies = drive(
            self._masters,
            lambda: self._scripts.held(token),
            self._timeout,
            (self.quorum, _positive),
        )
        lefts = sorted((r for r in replies if isinstance(r, int) and r > 0), reverse=True)
        outcome = rounds.verdict(replies, self.quorum, _positive)
        if outcome == "held":
            left_ms = lefts[self.quorum - 1]
            return max(0, left_ms - math.ceil(self._drift_s(left_ms) * 1000))
        if outcome == "gone":
            return 0
        gone = replies.count(0)
        errors = {i: r for i, r in enumerate(replies) if isinstance(r, BaseException)}
        # "Answered" is not enough to tell: a master that answered 0 (it never had the
        # lease, or it expired there) neither confirms it nor, alone, loses it.
        raise RedlockUnavailable(
            f"Redlock {self.name!r}: held() found it live on {len(lefts)} and not held on "
            f"{gone} of {len(self._masters)} masters ({self.quorum} needed either way), "
            f"no answer from {len(errors)}: {rounds.errors_text(self._masters, errors)}"
        )


def _positive(reply: object) -> bool:
    """True for a ``lock_held.lua`` reply that the lease is live (its ms left)."""
    return isinstance(reply, int) and reply > 0
