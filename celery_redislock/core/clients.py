"""The Redis clients the core's operations run through, as types.

:data:`~.scripts.RedisClient` is a synchronous client; :data:`AsyncRedisClient` its
``redis.asyncio`` twin (used by ``celery_redislock.asyncio``); :data:`AnyRedisClient`
either, for the I/O-free parts both drive (keys, arguments, restart grace). Types
only: nothing here imports ``redis.asyncio`` at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from .scripts import RedisClient

__all__ = ["AnyRedisClient", "AsyncRedisClient"]

AsyncRedisClient: TypeAlias = "AsyncRedis | AsyncRedisCluster"
"""An asyncio client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

AnyRedisClient: TypeAlias = "RedisClient | AsyncRedisClient"
"""A sync or asyncio client, for what the sync and async twins share without I/O."""
