"""What the exporter, the live page and ``celery redislock top`` read from Redis (#27).

:func:`read_counters` -- the event counters (:mod:`.schema`): one ``SCAN`` for their
hashes, one pipeline of ``HGETALL``. :func:`read_state` -- the gauges, read at scrape
time: one ``SCAN`` pass over the primitives' keys counts the locks held and waited
for (no per-lock read, whatever their number), then each pool and each limiter is read
with the core's own read-only scripts (the inventory's ``describe``; the limiter's
``info``), at most ``max_names`` of each: beyond that the rest are counted in
``omitted``, so the number of series stays bounded however many tenants' pools exist.
A few held locks are described for the page (``lock_details``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from ...core.inventory import Entry, OwnerParser, describe
from ...core.keys import decode_name
from ...core.parking import ParkingQueue, RateCapacity
from ...core.ratelimit import RedisRateLimiter, limiter_names
from ...core.scripts import RedisClient, as_text
from .schema import BUCKETS, HOLD, OUTCOMES, WAIT, counter_match, parse_counter_key

__all__ = [
    "DEFAULT_MAX_NAMES",
    "CounterSet",
    "Histogram",
    "Limiter",
    "State",
    "read_counters",
    "read_state",
]

DEFAULT_MAX_NAMES: Final = 200
"""Pools and limiters read (and exported) per scrape, at most."""

DEFAULT_LOCK_DETAILS: Final = 50
"""Held locks described one by one for the page, at most."""

_SCAN_COUNT: Final = 5000
_READERS: Final = 8
_ANY_TTL: Final = 30.0  # a reservation's TTL: unused by the read-only parking_info()
_POOL_KEYS: Final = frozenset(("holders", "queue", "parked", "dead"))


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (one per :data:`.schema.BUCKETS` bound, then ``+Inf``)
    and the sum in seconds."""

    cumulative: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """Events observed."""
        return self.cumulative[-1]

    @classmethod
    def from_fields(cls, fields: dict[str, str], stem: str) -> Histogram | None:
        """The histogram ``stem`` of a counter hash, None when it has no observation."""
        per_bucket = [int(fields.get(f"{stem}:{i}", 0)) for i in range(len(BUCKETS) + 1)]
        if not any(per_bucket):
            return None
        total, cumulative = 0, []
        for n in per_bucket:
            total += n
            cumulative.append(total)
        return cls(tuple(cumulative), int(fields.get(f"{stem}s", 0)) / 1e6)


@dataclass(frozen=True)
class CounterSet:
    """The counters of one kind and name."""

    kind: str
    name: str
    counts: dict[str, int]
    wait: Histogram | None
    hold: Histogram | None


@dataclass(frozen=True)
class Limiter:
    """One rate limiter now: its rates, seconds until the next admission, its penalty
    left, and the runs parked for their admission (how many, the oldest's age)."""

    name: str
    rates: tuple[str, ...]
    next_admission: float
    penalty_left: float
    parked: int = 0
    oldest_parked: float | None = None

    def to_json(self) -> dict[str, object]:
        """The limiter as JSON (the page's state)."""
        return {
            "name": self.name,
            "rates": list(self.rates),
            "next_admission": round(self.next_admission, 3),
            "penalty_left": round(self.penalty_left, 3),
            "parked": self.parked,
            "oldest_parked": None if self.oldest_parked is None else round(self.oldest_parked, 3),
        }


@dataclass
class State:
    """The gauges: what Redis holds now."""

    locks_held: int = 0
    locks_waited: int = 0
    lock_details: list[Entry] = field(default_factory=list)
    pools: list[Entry] = field(default_factory=list)
    limiters: list[Limiter] = field(default_factory=list)
    omitted: dict[str, int] = field(default_factory=dict)
    read_at: float = 0.0

    def to_json(self) -> dict[str, object]:
        """The state as JSON (the page's ``/state.json``)."""
        return {
            "locks_held": self.locks_held,
            "locks_waited": self.locks_waited,
            "locks": [e.to_json() for e in self.lock_details],
            "pools": [e.to_json() for e in self.pools],
            "limiters": [limiter.to_json() for limiter in self.limiters],
            "omitted": dict(self.omitted),
            "read_at": self.read_at,
        }


def _decode(fields: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in fields.items()}


def read_counters(client: RedisClient, prefix: str) -> list[CounterSet]:
    """Every counter hash under ``prefix``, sorted by kind and name."""
    found: list[tuple[str, str, bytes | str]] = []
    for raw in client.scan_iter(match=counter_match(prefix), count=_SCAN_COUNT):
        parsed = parse_counter_key(as_text(raw), prefix)
        if parsed is not None:
            found.append((*parsed, raw))
    found.sort(key=lambda f: (f[0], f[1]))
    pipe = client.pipeline(transaction=False)
    for _, _, raw in found:
        pipe.hgetall(raw)
    replies = pipe.execute() if found else []
    sets = []
    for (kind, name, _), reply in zip(found, replies, strict=True):
        fields = _decode(reply)
        counts = {o: int(fields[f"n:{o}"]) for o in OUTCOMES if f"n:{o}" in fields}
        wait = Histogram.from_fields(fields, WAIT)
        hold = Histogram.from_fields(fields, HOLD)
        sets.append(CounterSet(kind, name, counts, wait, hold))
    return sets


def _parse(key: str, prefix: str) -> tuple[str, str, str] | None:
    """``(kind, name, suffix)`` of ``{prefix}:{kind}:{{name}}:{suffix}``, else None."""
    head = f"{prefix}:"
    if not key.startswith(head):
        return None
    kind, sep, rest = key[len(head) :].partition(":{")
    encoded, sep2, suffix = rest.rpartition("}:")
    if not sep or not sep2 or "{" in encoded or "}" in encoded or ":" in suffix:
        return None
    return kind, decode_name(encoded), suffix


def _scan_primitives(client: RedisClient, prefix: str) -> tuple[set[str], set[str], set[str]]:
    """Names of the locks held, the locks waited for, and the pools with any state.

    One ``SCAN`` pass; its pattern lets through only the keys that tell (``holders``,
    ``queue``, ``parked``, ``dead``), not a lock's ``fence`` or a pool's ``meta``:
    the reply is about one key per held lock, parsed with string tests only.
    """
    held: set[str] = set()
    waited: set[str] = set()
    pools: set[str] = set()
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    lock_head, lock_held, lock_queue = f"{prefix}:lock:{{", "}:holders", "}:queue"
    for raw in client.scan_iter(match=f"{escaped}:*:{{*}}:[hqpd][ouae]*", count=_SCAN_COUNT):
        key = as_text(raw)
        if key.startswith(lock_head):
            if key.endswith(lock_held):
                held.add(key[len(lock_head) : -len(lock_held)])
            elif key.endswith(lock_queue):
                waited.add(key[len(lock_head) : -len(lock_queue)])
            continue
        parsed = _parse(key, prefix)
        if parsed is not None and parsed[0] == "semaphore" and parsed[2] in _POOL_KEYS:
            pools.add(parsed[1])
    return held, waited, pools


def _first(names: Iterable[str], limit: int) -> tuple[list[str], int]:
    ordered = sorted(names)
    return ordered[:limit], max(0, len(ordered) - limit)


def read_state(
    client: RedisClient,
    prefix: str,
    *,
    max_names: int = DEFAULT_MAX_NAMES,
    lock_details: int = 0,
    parse_owner: OwnerParser | None = None,
) -> State:
    """The gauges under ``prefix`` now (see the module's docs)."""
    from ..tokens import parse_owner as celery_owner

    owners = parse_owner or celery_owner
    held, waited, pool_names = _scan_primitives(client, prefix)
    state = State(locks_held=len(held), locks_waited=len(waited), read_at=time.time())
    shown, _ = _first(held, lock_details)
    names, state.omitted["semaphore"] = _first(pool_names, max_names)
    limiters, state.omitted["ratelimit"] = _first(limiter_names(client, prefix=prefix), max_names)

    def lock(encoded: str) -> Entry:
        return describe(client, prefix, "lock", decode_name(encoded), owners)

    def pool(name: str) -> Entry:
        return describe(client, prefix, "semaphore", name, owners)

    def limiter(name: str) -> Limiter | None:
        found = RedisRateLimiter.attach(client, name, prefix=prefix)
        if found is None:
            return None
        info = found.info()
        capacity = RateCapacity(client, name, rate=info.rates, prefix=prefix)
        park = ParkingQueue(capacity, reserve_ttl=_ANY_TTL).parking_info()
        parked = park.parked + park.claimed
        return Limiter(name, info.rates, info.wait, info.penalty_left, parked, park.oldest_age)

    # Each read is a round trip or two of the core's scripts: a few threads overlap
    # their waits (100 pools: 97 -> 38 ms on 2 cores, benchmarks/bench_exporter.py).
    with ThreadPoolExecutor(_READERS, thread_name_prefix="celery_redislock-read") as readers:
        locks = readers.map(lock, shown)
        pools = readers.map(pool, names)
        found = readers.map(limiter, limiters)
        state.lock_details = [e for e in locks if e.held]
        state.pools = [e for e in pools if e.exists]
        state.limiters = [lim for lim in found if lim is not None]
    return state
