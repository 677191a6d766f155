"""The park journal: a copy of every parked run kept in a Redis other than the lock Redis.

The parked queue lives in the lock Redis; if that Redis restarts without its data, the
runs parked there would be gone (their messages were acknowledged). The journal keeps
each parked run's payload in a second Redis (for Celery, the broker's) from the moment
it is parked until its run starts (:meth:`ParkJournal.drop`, called *before* the run
consumes its park token), so whoever sees the lock Redis come back empty can park
every journaled run again under its own token (:meth:`ParkJournal.entries`). Parking
again is idempotent (a token parked, claimed or taken already changes nothing), so
several recoverers at once, or a recovery racing a run that starts, never run a task
twice.

Lock Redis generations are told apart by a random mark it keeps (the caller's): the
journal remembers the marks it has recovered for (:meth:`ParkJournal.knows`,
:meth:`ParkJournal.learn`), the newest :data:`MARKS_KEPT`.

Keys (hash tag ``{parked}``): ``<prefix>:journal:{parked}:entries`` (hash: id ->
value), ``...:due`` (zset: id by when it is forgotten, server µs -- also park order),
``...:marks`` (zset: the lock Redis marks recovered for). Imports redis-py only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Final

from .keys import DEFAULT_PREFIX
from .parking import as_bytes
from .scripts import LuaScript, RedisClient, as_text
from .validate import ttl_to_ms

__all__ = ["MARKS_KEPT", "ParkJournal"]

MARKS_KEPT: Final = 64
"""Lock Redis marks remembered (one is added each time it loses its data)."""

_PUT = LuaScript("journal_put.lua")
_DROP = LuaScript("journal_drop.lua")


class ParkJournal:
    """The journal of parked runs under ``prefix`` on ``client`` (see the module)."""

    def __init__(self, client: RedisClient, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        base = f"{prefix}:journal:{{parked}}"
        self.entries_key, self.due_key, self.marks_key = (
            f"{base}:entries",
            f"{base}:due",
            f"{base}:marks",
        )
        self._keys = [self.entries_key, self.due_key]

    def put(self, entry_id: str, value: bytes, keep: float) -> None:
        """Record ``value`` under ``entry_id`` for ``keep`` seconds (one command); a
        re-sent put keeps the entry's first place in :meth:`entries`."""
        _PUT(self.client, self._keys, [entry_id, value, ttl_to_ms(keep, "keep")])

    def drop(self, entry_id: str) -> bool:
        """Forget ``entry_id`` (one command); True when it was recorded."""
        return bool(_DROP(self.client, self._keys, [entry_id]))

    def entries(self, batch: int = 500) -> Iterator[tuple[str, bytes]]:
        """``(id, value)`` of every recorded entry, oldest first; entries dropped
        while this iterates are skipped."""
        ids = [as_text(i) for i in self.client.zrange(self.due_key, 0, -1)]
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            for entry_id, value in zip(
                chunk, self.client.hmget(self.entries_key, chunk), strict=True
            ):
                if value is not None:
                    yield entry_id, as_bytes(value)

    def __len__(self) -> int:
        return int(self.client.hlen(self.entries_key))

    def knows(self, mark: str) -> bool:
        """True when recovery for the lock Redis marked ``mark`` was done."""
        return self.client.zscore(self.marks_key, mark) is not None

    def learn(self, mark: str) -> None:
        """Remember that recovery for ``mark`` was done (the newest few are kept)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self.marks_key, {mark: time.time()}, nx=True)  # the newest kept
        pipe.zremrangebyrank(self.marks_key, 0, -MARKS_KEPT - 1)
        pipe.execute()

    def __repr__(self) -> str:
        return f"<ParkJournal {self.entries_key!r}>"
