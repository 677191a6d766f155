"""The asyncio twin of the core: :class:`AsyncRedisLock`, :class:`AsyncRedisSemaphore`,
:class:`AsyncRedisRateLimiter` and :class:`AsyncLease` over ``redis.asyncio.Redis`` /
``redis.asyncio.RedisCluster``.

They run the sync core's scripts with its keys, arguments, reply reading, waiting and
renewal decisions (all I/O-free, in :mod:`celery_redislock.core`); only the calls to
Redis are awaited. So sync and async clients of one name share one lock or
semaphore: they exclude each other, wait in one FIFO queue and hand over to each
other. Wake-ups (one pub/sub connection) and renewal (one task) are per event loop;
a lease belongs to the loop that acquired it. Python 3.11+ (an ImportError on 3.10).
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):
    # Refused rather than half-working: on 3.10 a cancel that redis-py's wait_for
    # swallows is lost (no Task.cancelling()), and bursts are not batched (one
    # connection per concurrent call). The sync core and the Celery parts need 3.10 only.
    raise ImportError(
        "celery_redislock.asyncio needs Python 3.11+ (Task.cancelling() and "
        "asyncio.timeout() for its cancellation guarantees and batched calls); this is "
        f"Python {sys.version_info[0]}.{sys.version_info[1]}. celery_redislock and its "
        "Celery tasks work on 3.10."
    )

from .lease import AsyncLease, AsyncOnLost
from .lock import AsyncRedisLock
from .ratelimit import AsyncRedisRateLimiter
from .semaphore import AsyncRedisSemaphore

__all__ = [
    "AsyncLease",
    "AsyncOnLost",
    "AsyncRedisLock",
    "AsyncRedisRateLimiter",
    "AsyncRedisSemaphore",
]
