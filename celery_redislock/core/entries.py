"""What :mod:`.inventory` reports: one lock or semaphore as read at one instant
(:class:`Entry`) and each of its live leases (:class:`Holder`), with their stable JSON.

Plain data, no Redis; read by the ``celery redislock`` command's rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Entry", "Holder"]


@dataclass(frozen=True)
class Holder:
    """One live lease: who holds it, for how much longer, with which fence.

    ``owner`` is the owner id as stored (None when the holder gave none); ``task_id``
    and ``state`` (``"queued"`` or ``"running"``) are parsed from an owner id of the
    Celery layer (``state`` is None for any other owner). ``ttl`` is the seconds left
    unless renewed; ``token`` the first 8 characters of the lease token (too few to
    release or extend it).
    """

    owner: str | None
    task_id: str | None
    state: str | None
    ttl: float
    fence: int | None
    token: str

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
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
