"""The beat group's records in Redis: slot claims, the leader's note, and their reading.

Keys, for prefix ``redislock`` and group ``default`` (one hash tag: Redis Cluster
keeps them on one node, and the claim script may touch both of its keys)::

    redislock:beat:{default}:sent     hash entry -> "<slot ms> <claim token>"
    redislock:beat:{default}:by       hash entry -> "<claimed at, server ms> <owner>"

The leader lease itself is the ``RedisLock`` named ``beat:<group>``
(``redislock:lock:{beat:default}:holders``): its holder's owner id names the leader
and the lock's grant time says since when (``core/inventory.py`` reads both).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Final

from ...core.keys import KeySpace
from ...core.scripts import LuaScript, RedisClient, as_text, reply_array, reply_int

__all__ = ["BeatKeys", "BeatState", "Claims", "EntryState", "lock_name", "read_state"]

CLAIM: Final = LuaScript("beat_claim.lua")


def lock_name(group: str) -> str:
    """The name of the leader lease's lock of ``group``."""
    return f"beat:{group}"


@dataclass(frozen=True)
class BeatKeys:
    """The keys of one beat group."""

    sent: str
    by: str

    @classmethod
    def of(cls, prefix: str, group: str) -> BeatKeys:
        space = KeySpace.build(prefix, "beat", group)
        return cls(space.key("sent"), space.key("by"))


class Claims:
    """Claims of slots for one beat process (its token marks its claims)."""

    def __init__(self, client: RedisClient, keys: BeatKeys, owner: str) -> None:
        self._client = client
        self._keys = keys
        self.owner = owner
        self.token = secrets.token_hex(8)

    def last(self, entry: str) -> int | None:
        """The entry's last claimed slot (ms), None when it never had one."""
        raw = self._client.hget(self._keys.sent, entry)
        return None if raw is None else int(as_text(raw).split(" ", 1)[0])

    def claim(self, entry: str, slot_ms: int) -> tuple[bool, int]:
        """Claim ``slot_ms`` of ``entry`` in one atomic call: ``(True, slot)`` when it
        is ours to send, ``(False, last claimed slot)`` when it is not."""
        granted, slot = reply_array(
            CLAIM(
                self._client,
                [self._keys.sent, self._keys.by],
                [self.token, entry, slot_ms, self.owner],
            )
        )
        return bool(granted), reply_int(slot)


@dataclass(frozen=True)
class EntryState:
    """The last slot sent of one entry: its time, when it was claimed, by whom."""

    name: str
    slot: float
    claimed_at: float | None
    by: str | None


@dataclass(frozen=True)
class BeatState:
    """What ``celery redislock beat`` shows of a group."""

    group: str
    leader: str | None
    since: float | None
    entries: tuple[EntryState, ...]


def read_state(
    client: RedisClient, prefix: str, group: str, leader: str | None, since: float | None
) -> BeatState:
    """The group's last slots sent; ``leader`` holds the lease since ``since`` (epoch
    seconds; None: nobody leads)."""
    keys = BeatKeys.of(prefix, group)
    sent = {as_text(k): as_text(v) for k, v in (client.hgetall(keys.sent) or {}).items()}
    by = {as_text(k): as_text(v) for k, v in (client.hgetall(keys.by) or {}).items()}
    entries = []
    for name in sorted(sent):
        slot_ms = int(sent[name].split(" ", 1)[0])
        at, _, who = by.get(name, "").partition(" ")
        entries.append(
            EntryState(name, slot_ms / 1000.0, int(at) / 1000.0 if at else None, who or None)
        )
    return BeatState(group, leader, since, tuple(entries))
