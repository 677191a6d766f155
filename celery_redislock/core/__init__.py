"""The Redis core: lock, semaphore, rate limiter, leases and their renewal.

Imports redis-py and the standard library only, never Celery, so it can be used on
its own. Each operation is one Lua script in ``lua/``, run with EVALSHA.
"""

from __future__ import annotations

from .clear import release_all
from .keys import DEFAULT_PREFIX, KeySpace
from .lease import Lease
from .lock import RedisLock
from .ratelimit import RedisRateLimiter
from .redlock import RedlockLock
from .semaphore import RedisSemaphore

__all__ = [
    "DEFAULT_PREFIX",
    "KeySpace",
    "Lease",
    "RedisLock",
    "RedisRateLimiter",
    "RedisSemaphore",
    "RedlockLock",
    "release_all",
]
