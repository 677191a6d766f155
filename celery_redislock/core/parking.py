"""Parking: a FIFO queue of refused runs, handed capacity as it comes free.

A run refused capacity (a semaphore's permit; a rate limiter's admission) need not
poll. It is **parked**: an opaque payload (whatever the caller needs to start the run
again, e.g. a serialized message) is queued in Redis next to the capacity, under the
same hash tag. Whatever frees capacity (a release, a pump) **claims** the queue's head
in the same script: it reserves capacity for that entry (for ``reserve_ttl``) and
returns the payload, which the caller publishes at once (:data:`OnClaimed`). When the
run starts it **takes** its id (:meth:`ParkingQueue.take`): the reservation becomes
its own, and the id is remembered, so a second message of the same entry is known as
a duplicate and never runs.

The queue (:class:`ParkingQueue`) does not know what frees capacity: it asks a
:class:`Capacity` -- a small strategy saying which Redis keys and arguments describe
it; its Lua side (``lua/lib_capacity.lua``) answers how much is free, reserves it for a
claimed entry, turns a reservation into the run's, and gives it back. A semaphore's
free permits are one (:class:`SemaphoreCapacity`, with :class:`ParkingSemaphore`: a
semaphore whose every release hands its permit to its queue); a rate limiter's
admissions another (:class:`RateCapacity`: freed by time, so its caller pumps the
queue at the next admission time, :meth:`RateCapacity.retry_after`).

Nothing is lost to a process that dies half-way: a claimed entry keeps its payload
until its run takes it; if that does not happen within ``reserve_ttl`` (the publisher
died, the message was lost) the entry goes back to its old place in the queue and its
capacity to the next claim (:meth:`ParkingQueue.pump`, which a sweeper calls now and
then for every pool in :func:`parking_pools`). A payload that cannot be used is moved
to a dead-letter list (:meth:`ParkingQueue.give_back`). A semaphore's scripts obey its
stored limit, so a lowered limit drains the queue at the new limit.

Keys, beside the capacity's (``…:{name}:…``): ``parked`` (ids by ticket),
``payloads`` (payload, owner and ticket of each), ``claimed`` (ids by reservation
expiry), ``taken`` (consumed ids, remembered :data:`TAKEN_MEMORY_MS`), ``dead``
(dead letters); and ``<prefix>:parking:pools``, the set of pools that may hold parked
runs. See ``lua/lib_parking.lua`` for the states of an entry.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Protocol

from redis.typing import EncodableT, KeyT

from ..errors import ConfigurationError
from .keys import DEFAULT_PREFIX, decode_name, encode_name
from .lease import Lease, OnLost
from .lock import SCRIPT_CONSTANTS
from .operations import run
from .ratelimit_rates import check_cost
from .ratelimit_scripts import DEFAULT_SLOTS, RateLimitScripts, seen
from .restart import grace_args
from .scripts import (
    LuaScript,
    RedisClient,
    ScriptReply,
    as_text,
    key_encoder,
    reply_array,
    reply_int,
)
from .semaphore import RedisSemaphore
from .validate import ttl_to_ms

__all__ = [
    "DEAD_LETTERS",
    "HANDED_OVER",
    "NOT_PARKED",
    "PARKING_CONSTANTS",
    "START_MARGIN_US",
    "TAKEN_MEMORY_MS",
    "Capacity",
    "OnClaimed",
    "Parked",
    "ParkingInfo",
    "ParkingQueue",
    "ParkingSemaphore",
    "RateCapacity",
    "SemaphoreCapacity",
    "as_bytes",
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

START_MARGIN_US: Final = 10_000
"""A rate limiter's admission taken by a run is counted from this long (µs) after the
take, so the limit holds on the starts of the runs' bodies too (the take's reply and
Celery's hooks come between); a window then admits a little less than N per period
only when admissions follow each other back to back."""

PARKING_CONSTANTS: Final = {
    **SCRIPT_CONSTANTS,
    "TAKEN_MEMORY_MS": TAKEN_MEMORY_MS,
    "DEAD_LETTERS": DEAD_LETTERS,
    "SENT_WINDOW_US": SENT_WINDOW_US,
    "START_MARGIN_US": START_MARGIN_US,
}
"""The ``{{NAME}}`` constants of the parking scripts."""

_PARK = LuaScript("park.lua", PARKING_CONSTANTS)
_RELEASE = LuaScript("park_release.lua", PARKING_CONSTANTS)
_TAKE = LuaScript("park_take.lua", PARKING_CONSTANTS)
_EARLY: Final = 2  # park_take.lua's status of a run come before its admission time
_RETURN = LuaScript("park_return.lua", PARKING_CONSTANTS)
_INFO = LuaScript("park_info.lua", PARKING_CONSTANTS)

NOT_PARKED: Final = -1
"""``park(intake=True)``'s answer when the run need not park (see :meth:`ParkingQueue.park`)."""

HANDED_OVER: Final = -2
"""``park(intake=True, hand_over=True)``'s answer when capacity was free for the entry."""

TAKEN, REFUSED, DUPLICATE = "granted", "refused", "duplicate"  # what take() answers

_TAKE_SENT: ContextVar[float | None] = ContextVar("celery_redislock_take_sent", default=None)

MAX_AHEAD: Final = 1.0
"""The most seconds a :class:`RateCapacity` claims ahead (its runs wait up to that
long in place when they come early: a short wait, not a process held)."""

OnClaimed = Callable[["ParkingQueue", list["Parked"]], None]
"""Called with the entries an operation claimed; it publishes them (and hands any it
cannot to :meth:`ParkingQueue.give_back`)."""


@dataclass(frozen=True)
class Parked:
    """An entry a release (or a pump) claimed: publish ``payload``, whose run then
    calls :meth:`ParkingQueue.take` with ``id``."""

    id: str
    payload: bytes
    owner: str = ""


@dataclass(frozen=True)
class ParkingInfo:
    """A pool's parked runs: how many are queued, the oldest's age (seconds), how many
    are claimed (published, not started yet), how many were dead-lettered, the
    first few queued as ``(id, age, owner)``, and the claimed ones as ``(id, owner)``
    when asked for (a semaphore's claimed entry holds the permit reserved for it,
    whose lease token is its id, unless it is a standby)."""

    parked: int
    oldest_age: float | None
    claimed: int
    dead: int
    head: tuple[tuple[str, float, str], ...] = ()
    claimed_entries: tuple[tuple[str, str], ...] = ()


def new_entry_id() -> str:
    """A fresh park token: 128 random bits."""
    return secrets.token_hex(16)


def pools_key(prefix: str, kind: str = "semaphore") -> str:
    """The set of the names of pools of capacity ``kind`` that may hold parked runs
    (for sweepers): ``<prefix>:parking:pools`` for semaphores, ``<prefix>:parking:<kind>:pools``
    for any other kind."""
    return f"{prefix}:parking:pools" if kind == "semaphore" else f"{prefix}:parking:{kind}:pools"


def parking_pools(
    client: RedisClient, prefix: str = DEFAULT_PREFIX, kind: str = "semaphore"
) -> list[str]:
    """The names of the pools of capacity ``kind`` that may hold parked runs."""
    members = client.smembers(pools_key(prefix, kind))
    return sorted(decode_name(as_text(name)) for name in members)


def read_entries(flat: Iterable[ScriptReply]) -> list[Parked]:
    """The entries of a script reply that lists them flat: id, payload, owner, ..."""
    items = list(flat)
    return [
        Parked(as_text(items[i]), as_bytes(items[i + 1]), as_text(items[i + 2]))
        for i in range(0, len(items), 3)
    ]


def as_bytes(value: object) -> bytes:
    """A reply element as ``bytes``, whether the client decodes responses or not."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


class Capacity(Protocol):
    """What a :class:`ParkingQueue` hands out, and how its scripts reach it.

    The queue's keys live next to the capacity's (:meth:`key`, one hash tag); every
    parking script gets the capacity's :meth:`script_keys` after the queue's keys and
    its :meth:`script_args` after the script's own arguments, and its Lua side
    (``lua/lib_capacity.lua``, by the first argument: the kind) answers for it.
    """

    @property
    def name(self) -> str:
        """The pool's name (what the queue's runs wait for)."""
        ...

    @property
    def kind(self) -> str:
        """The capacity's kind in ``lib_capacity.lua`` (``"semaphore"``)."""
        ...

    @property
    def client(self) -> RedisClient:
        """The Redis client its keys live on."""
        ...

    @property
    def prefix(self) -> str:
        """The key prefix (the set of pools with parked runs is per prefix)."""
        ...

    def key(self, part: str) -> str:
        """The key ``part`` next to the capacity's own keys (same hash tag)."""
        ...

    def script_keys(self) -> list[KeyT]:
        """The capacity's KEYS, after the queue's (see ``capacity_of``)."""
        ...

    def script_args(self) -> list[EncodableT]:
        """The capacity's ARGV, its kind first, after the script's own arguments."""
        ...

    def take_ttl(self, ttl: float | None, owner: str | None) -> int:
        """Check a take's arguments; the milliseconds the run holds what it takes."""
        ...

    def taken(
        self,
        entry_id: str,
        fence: int,
        ttl_ms: int,
        owner: str | None,
        sent_at: float,
        renew: bool | None,
        on_lost: OnLost | None,
    ) -> Lease | None:
        """What a run that took ``entry_id`` holds (a semaphore's lease), if anything."""
        ...


class SemaphoreCapacity:
    """A :class:`RedisSemaphore`'s free permits as a :class:`ParkingQueue`'s capacity:
    a claimed entry's reservation is a permit whose lease token is the entry's id, and
    the run that takes it gets that lease (see ``lib_capacity.lua``, ``"semaphore"``)."""

    kind: Final = "semaphore"

    def __init__(self, semaphore: RedisSemaphore) -> None:
        self.semaphore = semaphore

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self.semaphore.name

    @property
    def client(self) -> RedisClient:
        """The semaphore's client."""
        return self.semaphore.client

    @property
    def prefix(self) -> str:
        """The semaphore's key prefix."""
        return self.semaphore.keys.prefix

    def key(self, part: str) -> str:
        """``<prefix>:semaphore:{name}:<part>``."""
        return self.semaphore.keys.key(part)

    def script_keys(self) -> list[KeyT]:
        """holders, leases, fence, meta, queue, alive, asks."""
        k = self.semaphore.keys
        return [k.holders, k.leases, k.fence, k.meta, k.queue, k.alive, k.asks]

    def script_args(self) -> list[EncodableT]:
        """``semaphore``, the limit, fair, the restart grace (or "")."""
        sem = self.semaphore
        return [
            self.kind,
            b"%d" % sem.limit,
            b"1" if sem.fair else b"0",
            *(grace_args(sem) or [b""]),
        ]

    def take_ttl(self, ttl: float | None, owner: str | None) -> int:
        """The run's lease time (the semaphore's ``ttl`` by default), capped."""
        return self.semaphore._lease_terms(ttl, None, owner)[0]

    def taken(
        self,
        entry_id: str,
        fence: int,
        ttl_ms: int,
        owner: str | None,
        sent_at: float,
        renew: bool | None,
        on_lost: OnLost | None,
    ) -> Lease:
        """The run's permit: the lease of token ``entry_id``."""
        sem = self.semaphore
        return sem._new_lease(entry_id, fence, ttl_ms, owner, sent_at, renew, on_lost, sem.max_hold)


class RateCapacity:
    """A rate limiter's admissions as a :class:`ParkingQueue`'s capacity (issue #25):
    the limiter ``name`` with ``rate`` on ``client`` (as
    :class:`~.ratelimit.RedisRateLimiter` takes them; the same keys, so it shares
    their charges with every limiter object of that name), each run costing ``cost``.

    A claim is an admission, charged when it is claimed (see ``lib_capacity.lua``,
    ``"rate"``); the queue's keys live under the limiter's hash tag. Nothing frees
    capacity but time: whoever parks runs here pumps the queue at
    :meth:`retry_after`'s time.

    ``ahead`` (seconds, default 0): a pump may claim a run up to that long before its
    admission time, charged at that time, so that a run published at once (about
    ``ahead`` on its way to a worker) starts on time; its :meth:`ParkingQueue.take`
    waits for that time when it comes early (#25).
    """

    kind: Final = "rate"

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        rate: str | list[str] | tuple[str, ...],
        cost: int = 1,
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
        start_spent: bool = True,
        ahead: float = 0.0,
    ) -> None:
        self.scripts = RateLimitScripts(client, name, rate, prefix, slots, start_spent)
        self.cost = check_cost(cost)
        if (
            isinstance(ahead, bool)
            or not isinstance(ahead, int | float)
            or not 0 <= ahead <= MAX_AHEAD
        ):
            raise ConfigurationError(f"ahead must be seconds in [0, {MAX_AHEAD}], got {ahead!r}")
        self.ahead_us = round(ahead * 1_000_000)
        if self.cost > self.scripts.smallest:
            raise ConfigurationError(
                f"cost must be at most the smallest limit of {name!r} "
                f"({self.scripts.smallest}), got {cost!r}"
            )
        self._client = client
        self._prefix = prefix

    @property
    def name(self) -> str:
        """The limiter's name."""
        return self.scripts.name

    @property
    def client(self) -> RedisClient:
        """The limiter's client."""
        return self._client

    @property
    def prefix(self) -> str:
        """The limiter's key prefix."""
        return self._prefix

    def key(self, part: str) -> str:
        """``<prefix>:ratelimit:{name}:<part>``."""
        return self.scripts.space.key(part)

    def script_keys(self) -> list[KeyT]:
        """log, state."""
        return list(self.scripts.keys)

    def script_args(self) -> list[EncodableT]:
        """``rate``, the cost, then the limiter's own (spec, slots, seen, start spent).

        A client that never heard from this limiter first asks it when ``cost`` is
        admitted (charging nothing), once: the reply tells until when its state is
        kept (``seen``), so that a later parking call finds the state lost (Redis
        restarted empty) and starts it spent. The parking scripts' replies do not
        carry it: without this, a worker or sender that only parked and took never
        knew, and a fresh burst passed after a loss (#25).
        """
        scripts = self.scripts
        if seen(self._client, scripts.base) == 0:
            run(self._client, scripts.attempt(self.cost, False))
        return [self.kind, self.cost, *scripts.lib_args(), self.ahead_us]

    def charge_late(self, entry_id: str, owner: str, margin_us: int = START_MARGIN_US) -> bool:
        """The run that took ``entry_id`` as ``owner`` started its body later than the
        charge its take left covers (``START_MARGIN_US`` after the take): that charge
        moves to the server's now plus ``margin_us`` (True), or -- its take's note gone
        -- the run is charged once more (False); see ``ratelimit_late.lua``."""
        done = key_encoder(self._client)(self.key(f"done:{entry_id}:take"))
        return run(self._client, self.scripts.late_charge(self.cost, margin_us, done, owner))

    def take_ttl(self, ttl: float | None, owner: str | None) -> int:
        """Nothing is held after an admission: 1 ms (unused)."""
        return 1

    def taken(
        self,
        entry_id: str,
        fence: int,
        ttl_ms: int,
        owner: str | None,
        sent_at: float,
        renew: bool | None,
        on_lost: OnLost | None,
    ) -> None:
        """An admission holds nothing."""
        return None


class ParkingQueue:
    """A FIFO queue of refused runs, handed ``capacity`` as it comes free.

    Args:
        capacity: what the runs wait for (see :class:`Capacity`).
        reserve_ttl: seconds capacity stays reserved for a claimed entry whose run has
            not started; then it goes back to the queue. A park stores it with the
            pool: releases and pumps through any object (a sweeper's) reserve what
            the latest park asked for.
        keep: seconds the parking keys outlive the latest park (payloads included).
        taken_memory: seconds a consumed park token is remembered (default
            :data:`TAKEN_MEMORY_MS`): longer than a broker may take to redeliver.
        on_claimed: publishes the entries an operation claimed (see :data:`OnClaimed`);
            without it claimed entries wait for their reservation to lapse.
        standby: runs to keep claimed ahead of the next release, without capacity:
            the caller publishes them like the others and their runs wait in place
            (a semaphore's ``acquire(timeout=...)``) when :meth:`take` refuses them,
            so the next release hands over with no broker round trip. 0: none.
    """

    def __init__(
        self,
        capacity: Capacity,
        *,
        reserve_ttl: float,
        keep: float = 86400.0,
        on_claimed: OnClaimed | None = None,
        standby: int = 0,
        taken_memory: float | None = None,
    ) -> None:
        self.capacity = capacity
        self._reserve_ms = ttl_to_ms(reserve_ttl, "reserve_ttl")
        self._keep_ms = ttl_to_ms(keep, "keep")
        self._taken_ms = (
            TAKEN_MEMORY_MS if taken_memory is None else ttl_to_ms(taken_memory, "taken_memory")
        )
        self.on_claimed = on_claimed
        if isinstance(standby, bool) or not isinstance(standby, int) or standby < 0:
            raise ConfigurationError(f"standby must be an int >= 0, got {standby!r}")
        self.standby = standby
        key = capacity.key
        self.parked_key, self.payloads_key = key("parked"), key("payloads")
        self.claimed_key, self.taken_key, self.dead_key = (
            key("claimed"),
            key("taken"),
            key("dead"),
        )

    def _script_keys(self, done: str) -> list[KeyT]:
        """The KEYS of a parking script: the queue's, ``done`` (a key of the call's
        own), the capacity's."""
        return [
            self.parked_key,
            self.payloads_key,
            self.claimed_key,
            self.taken_key,
            self.dead_key,
            self.capacity.key(f"done:{done}"),
            *self.capacity.script_keys(),
        ]

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

        ``intake``: park only if the run would be refused capacity now -- runs are
        parked already (FIFO: it goes behind them) or none is free -- else change
        nothing and return :data:`NOT_PARKED`: the caller starts the run, which takes
        capacity as usual (and parks after all if another took it meanwhile).
        ``hand_over`` (with ``intake``): park it and claim the free capacity for it
        instead, kept for the caller's own run, not published (:data:`HANDED_OVER`):
        the run takes it as a published one would (or its reservation lapses).

        Returns its 1-based place in the queue, 0 when it was claimed at once
        (capacity was free: :attr:`on_claimed` publishes it, like every entry claimed
        here). A re-sent park of the same id changes nothing, also once its run
        took it, and answers as the first did: a caller unsure whether a park went
        through parks again under the same id, never under a new one.
        """
        if not isinstance(payload, bytes):
            raise ConfigurationError(f"payload must be bytes, got {type(payload).__name__}")
        reply = _PARK(
            self.capacity.client,
            self._script_keys(entry_id),
            [
                entry_id,
                payload,
                owner,
                self._reserve_ms,
                self._keep_ms,
                self.standby,
                b"1" if intake and not hand_over else b"0",
                b"" if sent is None else b"%d" % int(sent * 1e6),
                *self.capacity.script_args(),
            ],
        )
        reply = reply_array(reply)
        position = reply_int(reply[0])
        if position == NOT_PARKED:
            return NOT_PARKED
        claimed = read_entries(reply[1:])
        if intake and hand_over and entry_id in {entry.id for entry in claimed}:
            position, claimed = HANDED_OVER, [e for e in claimed if e.id != entry_id]
        if position <= 1:
            # After the script, by whoever finds the queue empty (or claims at once): a
            # sweeper drops a pool from the set only after finding it empty, and adds
            # it back when a pump finds anything; a later parker finds the queue
            # non-empty, so it was (or will be) found by that pump.
            capacity = self.capacity
            capacity.client.sadd(
                pools_key(capacity.prefix, capacity.kind), encode_name(capacity.name)
            )
        self._deliver(claimed)
        return position

    def pump(self) -> tuple[int, list[Parked]]:
        """Hand all free capacity to the queue's head (lapsed reservations go back to
        the queue first). Returns the entries still parked and those claimed (already
        given to :attr:`on_claimed`)."""
        parked, claimed, _ = self.pump_until()
        return parked, claimed

    def pump_until(self) -> tuple[int, list[Parked], float | None]:
        """:meth:`pump`, and the seconds until the queue's head could be claimed, from
        the same script call: a rate limiter's next admission (0.0: now) while runs
        are still parked; None when none is, or the capacity is freed by releases."""
        _, parked, wait_us, claimed = self._release_and_claim("")
        return parked, claimed, None if wait_us < 0 else wait_us / 1_000_000

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

        Returns ``("granted", lease)`` -- the capacity reserved for it (a semaphore's
        permit: its lease), or free capacity when the reservation lapsed and nobody
        is parked ahead; ``("refused", None)`` -- the id is consumed but no capacity is
        free (park the run again, under a new id); ``("duplicate", None)`` -- the id
        was consumed before: do not run. A re-sent take with the same ``owner`` (its
        reply lost) gets its lease again. A run of a :class:`RateCapacity` claimed
        ahead that comes before its admission time waits for it here (at most
        ``ahead`` and a slot).
        """
        ttl_ms = self.capacity.take_ttl(ttl, owner)
        while True:
            sent_at = time.monotonic()
            _TAKE_SENT.set(sent_at)
            reply = _TAKE(
                self.capacity.client,
                self._script_keys(f"{entry_id}:take"),
                [entry_id, ttl_ms, owner or "", self._taken_ms, *self.capacity.script_args()],
            )
            reply = reply_array(reply)
            status = reply_int(reply[0])
            if status != _EARLY:
                break
            # Came before its admission time (a rate claim charged ahead): at most
            # ``ahead`` and a slot, by the server's clock.
            time.sleep(min(reply_int(reply[1]) / 1_000_000, MAX_AHEAD))
        if status < 0:
            return DUPLICATE, None
        if status == 0:
            return REFUSED, None
        lease = self.capacity.taken(
            entry_id, reply_int(reply[1]), reply_int(reply[2]), owner, sent_at, renew, on_lost
        )
        return TAKEN, lease

    @staticmethod
    def last_take_sent() -> float | None:
        """When (``time.monotonic()``) this thread's (asyncio task's) last :meth:`take`
        sent the call that answered it: its capacity was granted at the server's time
        of that call or later (a bound for when the run that took it started)."""
        return _TAKE_SENT.get()

    def give_back(self, entry_id: str, *, dead: str | None = None) -> bool:
        """Return a claimed entry that could not be published: to its old place in
        the queue, or (``dead`` = the reason) to the dead-letter list. Its reserved
        capacity is freed (call :meth:`pump` to hand it on). False when the entry was
        no longer claimed (a re-sent call answers as the first did)."""
        mode, reason = ("dead", " ".join(dead.split())) if dead is not None else ("park", "")
        return bool(
            _RETURN(
                self.capacity.client,
                self._script_keys(f"{entry_id}:back"),
                [entry_id, mode, reason, self._keep_ms, *self.capacity.script_args()],
            )
        )

    def known(self, entry_id: str) -> bool:
        """True when ``entry_id`` is parked, claimed or taken here (read-only, one round
        trip): a park of it would change nothing -- though it would answer the entries
        its first park claimed, to be published again (see ``park.lua``)."""
        pipe = self.capacity.client.pipeline(transaction=False)
        pipe.hexists(self.payloads_key, f"p:{entry_id}")
        pipe.zscore(self.taken_key, entry_id)
        stored, taken = pipe.execute()
        return bool(stored) or taken is not None

    def drop(self, entry_id: str) -> bool:
        """The run of ``entry_id`` leaves this queue for good (it parked in another
        queue first: a rate claim's run refused a concurrency permit, #25): consume
        its id as :meth:`take` would -- a later message of it is a duplicate -- and
        free what was reserved for it, charging nothing (a rate claim's charge is
        refunded: the run is charged when it starts). False when its id was consumed
        already (a re-sent drop answers so too)."""
        reply = _RETURN(
            self.capacity.client,
            self._script_keys(f"{entry_id}:back"),
            [entry_id, "drop", b"%d" % self._taken_ms, self._keep_ms, *self.capacity.script_args()],
        )
        return bool(reply)

    def dead_letters(self, count: int = 100) -> list[tuple[str, float, str, bytes]]:
        """The newest ``count`` dead letters: ``(id, epoch seconds, reason, payload)``."""
        rows = []
        for raw in self.capacity.client.lrange(self.dead_key, -count, -1):
            head, _, payload = as_bytes(raw).partition(b"\n")
            entry_id, at, reason = [*head.decode("utf-8", "replace").split(" ", 2), "", ""][:3]
            rows.append((entry_id, int(at or 0) / 1000.0, reason, payload))
        return rows

    def parking_info(self, count: int = 0, *, list_claimed: bool = False) -> ParkingInfo:
        """The parked queue (read-only); ``count`` of its oldest entries listed, and
        every claimed entry with ``list_claimed``."""
        now_us, parked, oldest, claimed, dead, listed, claimed_listed = reply_array(
            _INFO(
                self.capacity.client,
                [self.parked_key, self.claimed_key, self.dead_key, self.payloads_key],
                [count, b"1" if list_claimed else b"0"],
            )
        )
        now, rows, pairs = reply_int(now_us), reply_array(listed), reply_array(claimed_listed)
        head = tuple(
            (as_text(rows[i]), (now - reply_int(rows[i + 1])) / 1e6, as_text(rows[i + 2]))
            for i in range(0, len(rows), 3)
        )
        claimed_entries = tuple(
            (as_text(pairs[i]), as_text(pairs[i + 1])) for i in range(0, len(pairs), 2)
        )
        oldest_text = as_text(oldest)
        return ParkingInfo(
            reply_int(parked),
            (now - int(oldest_text)) / 1e6 if oldest_text else None,
            reply_int(claimed),
            reply_int(dead),
            head,
            claimed_entries,
        )

    def _release_and_claim(self, token: str) -> tuple[int, int, int, list[Parked]]:
        """Give back what ``token`` holds ("": nothing), then hand the free capacity on:
        (released, still parked, µs until the head could be claimed or -1, claimed)."""
        reply = _RELEASE(
            self.capacity.client,
            self._script_keys(token or "-"),
            [token, self._reserve_ms, self.standby, *self.capacity.script_args()],
        )
        reply = reply_array(reply)
        claimed = read_entries(reply[3:])
        self._deliver(claimed)
        return reply_int(reply[0]), reply_int(reply[1]), reply_int(reply[2]), claimed

    def _deliver(self, claimed: list[Parked]) -> None:
        if claimed and self.on_claimed is not None:
            self.on_claimed(self, claimed)


class ParkingSemaphore(RedisSemaphore, ParkingQueue):
    """A :class:`RedisSemaphore` whose refused runs can park: a :class:`ParkingQueue`
    of its free permits (:class:`SemaphoreCapacity`).

    Args (besides the semaphore's): ``reserve_ttl`` (default: ``ttl``), ``keep``,
    ``taken_memory``, ``on_claimed``, ``standby``, as :class:`ParkingQueue` takes them;
    ``acks``: ``min_replicas``, ``replica_timeout``, ``wait_aof`` of the semaphore's own
    grants (parking's scripts do not wait for replicas).

    A lease released through this object (``lease.release()``) hands the permit to a
    run waiting in place, else to the head of the parked queue.
    """

    def __init__(
        self,
        client: RedisClient,
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
        RedisSemaphore.__init__(
            self,
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
        ParkingQueue.__init__(
            self,
            SemaphoreCapacity(self),
            reserve_ttl=ttl if reserve_ttl is None else reserve_ttl,
            keep=keep,
            on_claimed=on_claimed,
            standby=standby,
            taken_memory=taken_memory,
        )

    def release_owner(self, owner: str) -> int:
        """As :meth:`RedisSemaphore.release_owner`, then hand the freed permits on."""
        released = super().release_owner(owner)
        if released:
            self.pump()
        return released

    def _release_token(self, token: str) -> bool:
        # The lease's side: its release hands the permit on (park_release.lua).
        released, _, _, _ = self._release_and_claim(token)
        return bool(released)

    def __repr__(self) -> str:
        return f"<ParkingSemaphore {self.name!r} limit={self.limit} ttl={self.ttl}>"
