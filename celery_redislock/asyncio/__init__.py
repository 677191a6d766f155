"""The asyncio twin of the core: :class:`AsyncRedisLock`, :class:`AsyncRedisSemaphore`
and :class:`AsyncLease` over ``redis.asyncio.Redis`` / ``redis.asyncio.RedisCluster``.

They run the sync core's scripts with its keys, arguments, reply reading, waiting and
renewal decisions (all I/O-free, in :mod:`celery_redislock.core`); only the calls to
Redis are awaited. So sync and async clients of one name share one lock or
semaphore: they exclude each other, wait in one FIFO queue and hand over to each
other. Wake-ups (one pub/sub connection) and renewal (one task) are per event loop;
a lease belongs to the loop that acquired it.
"""

from __future__ import annotations

from .lease import AsyncLease, AsyncOnLost
from .lock import AsyncRedisLock
from .semaphore import AsyncRedisSemaphore

__all__ = ["AsyncLease", "AsyncOnLost", "AsyncRedisLock", "AsyncRedisSemaphore"]
