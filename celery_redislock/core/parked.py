"""What a pool's parking queue holds, as Python reads it: a claimed entry (:class:`Parked`),
a pool's summary (:class:`ParkingInfo`), park tokens and the set of pools with parked runs.

Read by :mod:`.parking` (the :class:`~.parking.ParkingSemaphore`) and its callers.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .keys import DEFAULT_PREFIX, decode_name
from .scripts import as_text

__all__ = [
    "Parked",
    "ParkingInfo",
    "as_bytes",
    "new_entry_id",
    "parking_pools",
    "pools_key",
    "read_entries",
]


@dataclass(frozen=True)
class Parked:
    """An entry a release (or a pump) claimed: publish ``payload``, whose run then
    calls :meth:`ParkingSemaphore.take` with ``id``."""

    id: str
    payload: bytes
    owner: str = ""


@dataclass(frozen=True)
class ParkingInfo:
    """A pool's parked runs: how many are queued, the oldest's age (seconds), how many
    are claimed (published, not started yet), how many were dead-lettered, and the
    first few queued as ``(id, age, owner)``."""

    parked: int
    oldest_age: float | None
    claimed: int
    dead: int
    head: tuple[tuple[str, float, str], ...] = ()


def new_entry_id() -> str:
    """A fresh park token: 128 random bits."""
    return secrets.token_hex(16)


def pools_key(prefix: str) -> str:
    """The set of pool names that may hold parked runs (for sweepers)."""
    return f"{prefix}:parking:pools"


def parking_pools(client: Any, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The names of the pools that may hold parked runs."""
    return sorted(decode_name(as_text(name)) for name in client.smembers(pools_key(prefix)))


def read_entries(flat: Iterable[Any]) -> list[Parked]:
    """The entries of a script reply that lists them flat: id, payload, owner, ..."""
    items = list(flat)
    return [
        Parked(as_text(items[i]), as_bytes(items[i + 1]), as_text(items[i + 2]))
        for i in range(0, len(items), 3)
    ]


def as_bytes(value: Any) -> bytes:
    """A reply element as ``bytes``, whether the client decodes responses or not."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
