"""Parking: a FIFO queue of refused runs next to a semaphore, handed permits on release.

A run refused a permit need not poll. It is **parked**: an opaque payload (whatever
the caller needs to start the run again, e.g. a serialized message) is queued in
Redis next to the semaphore, under the same hash tag. The release that frees a permit
**claims** the queue's head in the same script: it reserves the permit for that entry
(a lease whose token is the entry's id, for ``reserve_ttl``) and returns the payload,
which the caller publishes at once (:data:`OnClaimed`). When the run starts it
**takes** its id (:meth:`ParkingSemaphore.take`): the reserved permit becomes its own
lease, and the id is remembered, so a second message of the same entry is known as a
duplicate and never runs.

Nothing is lost to a process that dies half-way: a claimed entry keeps its payload
until its run takes it; if that does not happen within ``reserve_ttl`` (the publisher
died, the message was lost) the entry goes back to its old place in the queue and its
permit to the next claim (:meth:`ParkingSemaphore.pump`, which a sweeper calls now and
then for every pool in :func:`parking_pools`). A payload that cannot be used is moved
to a dead-letter list (:meth:`ParkingSemaphore.give_back`). Every script obeys the
semaphore's stored limit, so a lowered limit drains the queue at the new limit.

Keys, beside the semaphore's (``…:{name}:…``): ``parked`` (ids by ticket),
``payloads`` (payload, owner and ticket of each), ``claimed`` (ids by reservation
expiry), ``taken`` (consumed ids, remembered :data:`TAKEN_MEMORY_MS`), ``dead``
(dead letters); and ``<prefix>:parking:pools``, the set of pools that may hold parked
runs. See ``lua/lib_parking.lua`` for the states of an entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from ..errors import ConfigurationError
from .keys import DEFAULT_PREFIX, encode_name
from .lease import Lease, OnLost
from .lock import SCRIPT_CONSTANTS
from .parked import Parked, ParkingInfo, new_entry_id, parking_pools, pools_key
from .parked import as_bytes as _bytes
from .parked import read_entries as _entries
from .restart import grace_args
from .scripts import LuaScript, as_text
from .semaphore import RedisSemaphore
from .validate import ttl_to_ms

__all__ = [
    "DEAD_LETTERS",
    "HANDED_OVER",
    "NOT_PARKED",
    "PARKING_CONSTANTS",
    "TAKEN_MEMORY_MS",
    "OnClaimed",
    "Parked",
    "ParkingInfo",
    "ParkingSemaphore",
    "new_entry_id",
    "parking_pools",
    "pools_key",
]

TAKEN_MEMORY_MS: Final = 3_600_000
"""How long a consumed park token is remembered by default (a duplicate message of the
entry arriving later than this would run again); ``taken_memory`` sets it per object."""

DEAD_LETTERS: Final = 1000
"""Dead-lettered entries kept per pool (the oldest are dropped first)."""

SENT_WINDOW_US: Final = 60_000_000
"""A run parked with its sending time (``park(sent=...)``) is placed by that time, but
never more than this long (µs) before its parking: a sender whose clock runs behind
gets ahead of at most a minute of others' runs."""

PARKING_CONSTANTS: Final = {
    **SCRIPT_CONSTANTS,
    "TAKEN_MEMORY_MS": TAKEN_MEMORY_MS,
    "DEAD_LETTERS": DEAD_LETTERS,
    "SENT_WINDOW_US": SENT_WINDOW_US,
}
"""The ``{{NAME}}`` constants of the parking scripts."""

_PARK = LuaScript("park.lua", PARKING_CONSTANTS)
_RELEASE = LuaScript("park_release.lua", PARKING_CONSTANTS)
_TAKE = LuaScript("park_take.lua", PARKING_CONSTANTS)
_RETURN = LuaScript("park_return.lua", PARKING_CONSTANTS)
_INFO = LuaScript("park_info.lua", PARKING_CONSTANTS)

NOT_PARKED: Final = -1
"""``park(intake=True)``'s answer when the run need not park (see :meth:`ParkingSemaphore.park`)."""

HANDED_OVER: Final = -2
"""``park(intake=True, hand_over=True)``'s answer when a permit was free for the entry."""

TAKEN, REFUSED, DUPLICATE = "granted", "refused", "duplicate"  # what take() answers

OnClaimed = Callable[["ParkingSemaphore", list[Parked]], None]
"""Called with the entries an operation claimed; it publishes them (and hands any it
cannot to :meth:`ParkingSemaphore.give_back`)."""


class ParkingSemaphore(RedisSemaphore):
    """A :class:`RedisSemaphore` whose refused runs can park in a FIFO queue.

    Args (besides the semaphore's):
        reserve_ttl: seconds a permit stays reserved for a claimed entry whose run has
            not started (default: ``ttl``); then it goes back to the queue. A park
            stores it with the pool: releases and pumps through any object (a
            sweeper's) reserve what the latest park asked for.
        keep: seconds the parking keys outlive the latest park (payloads included).
        taken_memory: seconds a consumed park token is remembered (default
            :data:`TAKEN_MEMORY_MS`): longer than a broker may take to redeliver.
        on_claimed: publishes the entries an operation claimed (see :data:`OnClaimed`);
            without it claimed entries wait for their reservation to lapse.
        standby: runs to keep claimed ahead of the next release, without a permit: the
            caller publishes them like the others and their runs wait in place
            (``acquire(timeout=...)``) when :meth:`take` refuses them, so the next
            release hands the permit over with no broker round trip. 0: none.
        acks: ``min_replicas``, ``replica_timeout``, ``wait_aof`` of the semaphore's
            own grants (parking's scripts do not wait for replicas).

    A lease released through this object (``lease.release()``) hands the permit to a
    run waiting in place, else to the head of the parked queue.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        limit: int,
        ttl: float = 30.0,
        fair: bool = False,
        prefix: str = DEFAULT_PREFIX,
        renew: bool = False,
        max_hold: float | None = None,
        reserve_ttl: float | None = None,
        keep: float = 86400.0,
        on_claimed: OnClaimed | None = None,
        standby: int = 0,
        taken_memory: float | None = None,
        **acks: Any,
    ) -> None:
        super().__init__(
            client,
            name,
            limit=limit,
            ttl=ttl,
            fair=fair,
            prefix=prefix,
            renew=renew,
            max_hold=max_hold,
            **acks,
        )
        self._reserve_ms = (
            self._ttl_ms if reserve_ttl is None else ttl_to_ms(reserve_ttl, "reserve_ttl")
        )
        self._keep_ms = ttl_to_ms(keep, "keep")
        self._taken_ms = (
            TAKEN_MEMORY_MS if taken_memory is None else ttl_to_ms(taken_memory, "taken_memory")
        )
        self.on_claimed = on_claimed
        if isinstance(standby, bool) or not isinstance(standby, int) or standby < 0:
            raise ConfigurationError(f"standby must be an int >= 0, got {standby!r}")
        self.standby = standby
        self._prefix = prefix
        k = self._keys
        self.parked_key, self.payloads_key = k.key("parked"), k.key("payloads")
        self.claimed_key, self.taken_key, self.dead_key = (
            k.key("claimed"),
            k.key("taken"),
            k.key("dead"),
        )
        self._flags_args = [b"%d" % self.limit, b"1" if fair else b"0"]

    # -- parking -------------------------------------------------------------------

    def park(
        self,
        entry_id: str,
        payload: bytes,
        owner: str = "",
        *,
        intake: bool = False,
        sent: float | None = None,
        hand_over: bool = False,
    ) -> int:
        """Queue ``payload`` under ``entry_id`` (see :func:`new_entry_id`) at the tail
        (``sent``: when the run was sent, epoch seconds by the sender's clock: it goes
        to its place by sending time instead, at most :data:`SENT_WINDOW_US` before now).

        ``intake``: park only if the run would be refused a permit now -- runs are
        parked already (FIFO: it goes behind them) or none is free -- else change
        nothing and return :data:`NOT_PARKED`: the caller starts the run, which takes
        a permit as usual (and parks after all if another took it meanwhile).
        ``hand_over`` (with ``intake``): park it and claim the free permit for it
        instead, kept for the caller's own run, not published (:data:`HANDED_OVER`):
        the run takes it as a published one would (or its reservation lapses).

        Returns its 1-based place in the queue, 0 when it was claimed at once (a
        permit was free: :attr:`on_claimed` publishes it, like every entry claimed
        here). A re-sent park of the same id changes nothing, also once its run
        took it, and answers as the first did: a caller unsure whether a park went
        through parks again under the same id, never under a new one.
        """
        if not isinstance(payload, bytes):
            raise ConfigurationError(f"payload must be bytes, got {type(payload).__name__}")
        k = self._keys
        reply = _PARK(
            self._client,
            [
                k.holders,
                k.leases,
                k.fence,
                k.meta,
                k.queue,
                self.parked_key,
                self.payloads_key,
                self.claimed_key,
                self.taken_key,
                k.done(entry_id),
            ],
            [
                entry_id,
                payload,
                owner,
                self.limit,
                self._reserve_ms,
                self._keep_ms,
                self.standby,
                b"1" if intake and not hand_over else b"0",
                b"" if sent is None else b"%d" % int(sent * 1e6),
                *grace_args(self),
            ],
        )
        position = int(reply[0])
        if position == NOT_PARKED:
            return NOT_PARKED
        claimed = _entries(reply[1:])
        if intake and hand_over and entry_id in {entry.id for entry in claimed}:
            position, claimed = HANDED_OVER, [e for e in claimed if e.id != entry_id]
        if position <= 1:
            # After the script, by whoever finds the queue empty (or claims at once): a
            # sweeper drops a pool from the set only after finding it empty, and adds
            # it back when a pump finds anything; a later parker finds the queue
            # non-empty, so it was (or will be) found by that pump.
            self._client.sadd(pools_key(self._prefix), encode_name(self.name))
        self._deliver(claimed)
        return position

    def pump(self) -> tuple[int, list[Parked]]:
        """Hand every free permit to the queue's head (lapsed reservations go back to
        the queue first). Returns the entries still parked and those claimed (already
        given to :attr:`on_claimed`)."""
        return self._release_and_claim("")[1:]

    def take(
        self,
        entry_id: str,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
    ) -> tuple[str, Lease | None]:
        """The run of a claimed entry starts: consume ``entry_id``, once.

        Returns ``("granted", lease)`` -- the permit reserved for it, or a free one
        when the reservation lapsed and nobody is parked ahead; ``("refused", None)``
        -- the id is consumed but no permit is free (park the run again, under a new
        id); ``("duplicate", None)`` -- the id was consumed before: do not run. A
        re-sent take with the same ``owner`` (its reply lost) gets its lease again.
        """
        ttl_ms, max_hold = self._lease_terms(ttl, None, owner)
        k = self._keys
        sent_at = time.monotonic()
        reply = _TAKE(
            self._client,
            [
                k.holders,
                k.leases,
                k.fence,
                k.meta,
                k.queue,
                self.parked_key,
                self.payloads_key,
                self.claimed_key,
                self.taken_key,
            ],
            [
                entry_id,
                ttl_ms,
                owner or "",
                self.limit,
                *(grace_args(self) or [b""]),
                self._taken_ms,
            ],
        )
        status = int(reply[0])
        if status < 0:
            return DUPLICATE, None
        if status == 0:
            return REFUSED, None
        lease = self._new_lease(
            entry_id, int(reply[1]), int(reply[2]), owner, sent_at, renew, on_lost, max_hold
        )
        return TAKEN, lease

    def give_back(self, entry_id: str, *, dead: str | None = None) -> bool:
        """Return a claimed entry that could not be published: to its old place in
        the queue, or (``dead`` = the reason) to the dead-letter list. Its reserved
        permit is freed (call :meth:`pump` to hand it on). False when the entry was
        no longer claimed (a re-sent call answers as the first did)."""
        mode, reason = ("dead", " ".join(dead.split())) if dead is not None else ("park", "")
        k = self._keys
        return bool(
            _RETURN(
                self._client,
                [
                    k.holders,
                    k.leases,
                    self.parked_key,
                    self.payloads_key,
                    self.claimed_key,
                    self.dead_key,
                    k.done(f"{entry_id}:back"),
                ],
                [entry_id, mode, reason, self._keep_ms],
            )
        )

    def dead_letters(self, count: int = 100) -> list[tuple[str, float, str, bytes]]:
        """The newest ``count`` dead letters: ``(id, epoch seconds, reason, payload)``."""
        rows = []
        for raw in self._client.lrange(self.dead_key, -count, -1):
            head, _, payload = _bytes(raw).partition(b"\n")
            entry_id, at, reason = [*head.decode("utf-8", "replace").split(" ", 2), "", ""][:3]
            rows.append((entry_id, int(at or 0) / 1000.0, reason, payload))
        return rows

    def parking_info(self, count: int = 0) -> ParkingInfo:
        """The parked queue (read-only); ``count`` of its oldest entries listed."""
        now_us, parked, oldest, claimed, dead, rows = _INFO(
            self._client,
            [self.parked_key, self.claimed_key, self.dead_key, self.payloads_key],
            [count],
        )
        now = int(now_us)
        head = tuple(
            (as_text(rows[i]), (now - int(rows[i + 1])) / 1e6, as_text(rows[i + 2]))
            for i in range(0, len(rows), 3)
        )
        oldest_text = as_text(oldest)
        return ParkingInfo(
            int(parked),
            (now - int(oldest_text)) / 1e6 if oldest_text else None,
            int(claimed),
            int(dead),
            head,
        )

    def release_owner(self, owner: str) -> int:
        """As :meth:`RedisSemaphore.release_owner`, then hand the freed permits on."""
        released = super().release_owner(owner)
        if released:
            self.pump()
        return released

    # -- the lease's side ------------------------------------------------------------

    def _release_token(self, token: str) -> bool:
        released, _, _ = self._release_and_claim(token)
        return bool(released)

    def _release_and_claim(self, token: str) -> tuple[int, int, list[Parked]]:
        k = self._keys
        reply = _RELEASE(
            self._client,
            [
                k.holders,
                k.leases,
                k.queue,
                k.alive,
                k.meta,
                k.asks,
                k.fence,
                self.parked_key,
                self.payloads_key,
                self.claimed_key,
                k.done(token or "-"),
            ],
            [token, *self._flags_args, self._reserve_ms, self.standby, *grace_args(self)],
        )
        claimed = _entries(reply[2:])
        self._deliver(claimed)
        return int(reply[0]), int(reply[1]), claimed

    def _deliver(self, claimed: list[Parked]) -> None:
        if claimed and self.on_claimed is not None:
            self.on_claimed(self, claimed)

    def __repr__(self) -> str:
        return f"<ParkingSemaphore {self.name!r} limit={self.limit} ttl={self.ttl}>"
