"""Read-only views of a lock or semaphore, for inspection tools and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HolderInfo", "PrimitiveInfo"]


@dataclass(frozen=True)
class HolderInfo:
    """One live lease.

    ``token_hint`` is the first 8 characters of the token: enough to tell leases
    apart, too little to release or extend them.
    """

    token_hint: str
    ttl_left: float
    fence: int | None = None
    owner: str | None = None


@dataclass(frozen=True)
class PrimitiveInfo:
    """State of a lock or semaphore at one instant of the server's clock.

    ``since`` is the server time (seconds since the epoch) of the first grant of the
    current holding; ``limit`` is None for a lock.
    """

    kind: str
    name: str
    holders: list[HolderInfo] = field(default_factory=list)
    waiters: int = 0
    owner: str | None = None
    since: float | None = None
    fence: int | None = None
    limit: int | None = None

    @property
    def held(self) -> bool:
        """True while at least one lease is live."""
        return bool(self.holders)

    @property
    def ttl_left(self) -> float:
        """Seconds until the longest lease expires unless renewed (0 when free)."""
        return max((h.ttl_left for h in self.holders), default=0.0)
