"""What the locks and semaphores under a key prefix hold right now (read, and release).

The read side of the ``celery redislock`` command, usable from any tool: it finds the
primitives with ``SCAN`` (never ``KEYS``) on their ``holders`` keys, which exist exactly
while something holds them, and on their ``queue`` keys, which exist while something
waits; it then reads each one with the core's own read-only ``info()`` script. A free
primitive with no waiter leaves no key behind, so it is not listed.

Each primitive is reported as an :class:`Entry` (one lock or semaphore as read at one
instant) with a :class:`Holder` per live lease, plain data with a stable JSON form,
read by the ``celery redislock`` command's rendering.

Owner ids are shown whole unless the caller passes ``parse_owner``: the Celery layer
passes ``parse_owner`` of its tokens module, which
splits its owner ids into the task id and the state of the lease, ``queued`` (taken
when the task was sent) or ``running`` (adopted by the worker running it). A permit a
release handed to a parked run (see :mod:`.parking`: claimed, the run on its way to a
worker, not started yet) is ``reserved``, whatever its owner id: the parked run's. Core
knowledge only: this module never imports the Celery layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from .info import PrimitiveInfo
from .keys import decode_name
from .lock import RedisLock
from .parking import ParkingSemaphore
from .scripts import RedisClient, as_text

__all__ = [
    "KINDS",
    "RESERVED",
    "Entry",
    "Holder",
    "OwnerParser",
    "describe",
    "find",
    "force_release",
    "matching_owners",
    "release_owner",
    "scan",
    "snapshot",
    "whole_owner",
]

KINDS: Final = ("lock", "semaphore")
"""The kinds of primitive, as spelled in their keys and in the CLI's ``--kind``."""

# A semaphore is read through an object that needs a limit; info() reports the limit
# stored by the last acquire, or this one when none is stored (then shown as unknown).
_UNKNOWN_LIMIT: Final = 2**62

_HINT: Final = 8  # characters of a lease token that info() shows (HolderInfo.token_hint)
_SCAN_COUNT: Final = 1000
_SCANNED: Final = frozenset(("holders", "queue", "parked", "dead"))
_GLOB_SPECIAL: Final = frozenset("*?[]\\")


OwnerParser = Callable[[str | None], tuple[str | None, bool | None]]
"""Splits an owner id into ``(task id, running?)``; ``running`` None when unknown."""


def whole_owner(owner: str | None) -> tuple[str | None, bool | None]:
    """The default :data:`OwnerParser`: the owner id whole, its state unknown."""
    return owner, None


@dataclass(frozen=True)
class Holder:
    """One live lease: who holds it, for how much longer, with which fence.

    ``owner`` is the owner id as stored (None when the holder gave none); ``task_id``
    and ``state`` (``"queued"`` or ``"running"``) are parsed from an owner id of the
    Celery layer (``state`` is None for any other owner), except that a semaphore's
    permit reserved for a parked run that a release handed it to, whose run has not
    started yet, is ``"reserved"`` (``owner`` the parked run's: the Celery layer's is
    its task id). ``ttl`` is the seconds left
    unless renewed; ``token`` the first 8 characters of the lease token (too few to
    release or extend it).
    """

    owner: str | None
    task_id: str | None
    state: str | None
    ttl: float
    fence: int | None
    token: str

    def to_json(self) -> dict[str, object]:
        """The holder as a JSON object with stable keys (see the CLI's help)."""
        return {
            "owner": self.owner,
            "task_id": self.task_id,
            "state": self.state,
            "ttl": round(self.ttl, 3),
            "fence": self.fence,
            "token": self.token,
        }


@dataclass(frozen=True)
class Entry:
    """One lock or semaphore as read at one instant.

    ``limit`` is None for a lock, and for a semaphore whose stored limit is gone;
    ``since`` is the server time (epoch seconds) of the first grant of the current
    holding; ``fence`` the highest fence among the live leases. A semaphore's
    ``parked`` runs wait in its queue (see :mod:`.parking`), the oldest for
    ``oldest_parked`` seconds; ``dead`` counts its dead-lettered entries.
    """

    kind: str
    name: str
    holders: tuple[Holder, ...]
    waiters: int
    limit: int | None
    since: float | None
    fence: int | None
    parked: int = 0
    oldest_parked: float | None = None
    dead: int = 0

    @property
    def held(self) -> bool:
        """True while at least one lease is live."""
        return bool(self.holders)

    @property
    def exists(self) -> bool:
        """True while something holds, waits for or is parked at the primitive."""
        return self.held or self.waiters > 0 or self.parked > 0 or self.dead > 0

    @property
    def available(self) -> int | None:
        """Free permits of a semaphore (None for a lock or an unknown limit)."""
        if self.limit is None:
            return None
        return max(0, self.limit - len(self.holders))

    @property
    def ttl(self) -> float:
        """Seconds until the longest lease expires unless renewed (0 when free)."""
        return max((h.ttl for h in self.holders), default=0.0)

    def to_json(self) -> dict[str, object]:
        """The primitive as a JSON object with stable keys (see the CLI's help)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "held": self.held,
            "holders": [h.to_json() for h in self.holders],
            "waiters": self.waiters,
            "limit": self.limit,
            "available": self.available,
            "ttl": round(self.ttl, 3),
            "fence": self.fence,
            "since": self.since,
            "parked": self.parked,
            "oldest_parked": None if self.oldest_parked is None else round(self.oldest_parked, 3),
            "dead": self.dead,
        }


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def _parse_key(key: str, prefix: str, suffix: str) -> tuple[str, str] | None:
    """``(kind, name)`` of ``{prefix}:{kind}:{{encoded name}}:{suffix}``, else None."""
    head, tail = f"{prefix}:", f"}}:{suffix}"
    if not key.startswith(head) or not key.endswith(tail):
        return None
    kind, sep, rest = key[len(head) : -len(tail)].partition(":{")
    if not sep or kind not in KINDS or not rest or "{" in rest or "}" in rest:
        return None
    return kind, decode_name(rest)


def scan(client: RedisClient, prefix: str, kinds: Iterable[str] = KINDS) -> list[tuple[str, str]]:
    """``(kind, name)`` of every primitive held or waited for, sorted, by ``SCAN``."""
    wanted = tuple(kinds)
    found: set[tuple[str, str]] = set()
    kind_glob = wanted[0] if len(wanted) == 1 else "*"
    # One pass over the keyspace: a primitive is listed while something holds it
    # (holders), waits for it (queue) or is parked at it (parked, dead letters).
    match = f"{_glob_escape(prefix)}:{kind_glob}:{{*}}:*"
    for raw in client.scan_iter(match=match, count=_SCAN_COUNT):
        key = as_text(raw)
        suffix = key.rsplit(":", 1)[-1]
        if suffix not in _SCANNED:
            continue
        parsed = _parse_key(key, prefix, suffix)
        if parsed is not None and parsed[0] in wanted:
            found.add(parsed)
    return sorted(found)


RESERVED: Final = "reserved"
""":attr:`Holder.state` of a permit reserved for a claimed parked run."""


def _holders(
    info: PrimitiveInfo, parse_owner: OwnerParser, reserved: frozenset[tuple[str, str]]
) -> tuple[Holder, ...]:
    """``reserved``: ``(token hint, owner)`` of the claimed entries (a reserved permit's
    token is its entry's id); matched on both, a random lease's hint alone could
    collide."""
    holders = []
    for h in info.holders:
        task_id, running = parse_owner(h.owner)
        state = None if running is None else ("running" if running else "queued")
        if (h.token_hint, h.owner or "") in reserved:
            state = RESERVED
        holders.append(Holder(h.owner, task_id, state, max(0.0, h.ttl_left), h.fence, h.token_hint))
    return tuple(sorted(holders, key=lambda h: (h.fence is None, h.fence or 0, h.token)))


def _primitive(
    client: RedisClient, prefix: str, kind: str, name: str, limit: int
) -> RedisLock | ParkingSemaphore:
    if kind == "lock":
        return RedisLock(client, name, prefix=prefix)
    if kind == "semaphore":
        return ParkingSemaphore(client, name, limit=limit, prefix=prefix)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def describe(
    client: RedisClient,
    prefix: str,
    kind: str,
    name: str,
    parse_owner: OwnerParser = whole_owner,
) -> Entry:
    """Read one primitive (one round trip; a semaphore two, with its parked runs); a
    free one has no holders, waiters or parked runs."""
    primitive = _primitive(client, prefix, kind, name, _UNKNOWN_LIMIT)
    info: PrimitiveInfo = primitive.info()
    limit = info.limit if info.limit != _UNKNOWN_LIMIT else None
    if not isinstance(primitive, ParkingSemaphore):
        holders = _holders(info, parse_owner, frozenset())
        return Entry(kind, name, holders, info.waiters, limit, info.since, info.fence)
    park = primitive.parking_info(list_claimed=True)
    # Read after the holders (two round trips): a run that took its reserved permit
    # in between shows, this once, its parked owner id and no state.
    reserved = frozenset((entry_id[:_HINT], owner) for entry_id, owner in park.claimed_entries)
    return Entry(
        kind,
        name,
        _holders(info, parse_owner, reserved),
        info.waiters,
        limit,
        info.since,
        info.fence,
        park.parked + park.claimed,
        park.oldest_age,
        park.dead,
    )


def snapshot(
    client: RedisClient,
    prefix: str,
    kinds: Iterable[str] = KINDS,
    parse_owner: OwnerParser = whole_owner,
) -> list[Entry]:
    """Every primitive held or waited for under ``prefix``, sorted by kind and name."""
    found = scan(client, prefix, kinds)
    entries = (describe(client, prefix, kind, name, parse_owner) for kind, name in found)
    return [entry for entry in entries if entry.exists]  # skip any freed since the scan


def find(
    client: RedisClient,
    prefix: str,
    name: str,
    kinds: Iterable[str] = KINDS,
    parse_owner: OwnerParser = whole_owner,
) -> list[Entry]:
    """The primitives named ``name`` (of the given kinds) held or waited for now."""
    entries = (describe(client, prefix, kind, name, parse_owner) for kind in kinds)
    return [entry for entry in entries if entry.exists]


def matching_owners(entry: Entry, wanted: str) -> list[str]:
    """The distinct owner ids of ``entry`` that ``wanted`` names.

    ``wanted`` names an owner id when it equals it, or when it is the task id of an
    owner id of the Celery layer (the part before its ``#``/``@`` marker).
    """
    owners: list[str] = []
    for h in entry.holders:
        if h.owner and h.owner not in owners and wanted in (h.owner, h.task_id):
            owners.append(h.owner)
    return owners


def release_owner(client: RedisClient, prefix: str, entry: Entry, owner: str) -> int:
    """Release the leases of ``entry`` whose owner id is exactly ``owner``.

    Atomic and owner-checked on the server: 0 when the primitive changed hands since
    it was read.
    """
    primitive = _primitive(client, prefix, entry.kind, entry.name, entry.limit or 1)
    return int(primitive.release_owner(owner))


def force_release(client: RedisClient, prefix: str, entry: Entry) -> int:
    """Release every lease of ``entry``, whoever holds it; the number released.

    The holders are not stopped: each lease reports itself lost at its next renewal,
    extend or release.
    """
    primitive = _primitive(client, prefix, entry.kind, entry.name, entry.limit or 1)
    return int(primitive.force_release())
