"""``RedisSemaphore``: placeholder until the semaphore issue lands."""

from __future__ import annotations

from typing import Any

__all__ = ["RedisSemaphore"]


class RedisSemaphore:
    """Not built yet: raises on construction rather than pretend to limit anything."""

    def __init__(self, client: Any, name: str, **options: Any) -> None:
        raise NotImplementedError("RedisSemaphore is not implemented yet")
