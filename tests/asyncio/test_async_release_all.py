"""An async lease removed by ``release_all`` (an operator's clean-up, sync client) is
lost to its holder: its own ``release()`` answers False and sets ``lost`` (#30 item 6)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.core import release_all
from celery_redislock.core.keys import DEFAULT_PREFIX


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_async_lease_removed_by_release_all_is_lost(
    r: redis.Redis, redis_url: str, kind: str
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            primitive = (
                AsyncRedisLock(client, "job", ttl=30)
                if kind == "lock"
                else AsyncRedisSemaphore(client, "pool", limit=1, ttl=30)
            )
            lease = await primitive.acquire()
            assert lease is not None
            assert release_all(r, prefix=DEFAULT_PREFIX) == 1
            assert await lease.release() is False
            assert lease.lost and "no longer held" in lease.lost_reason
        finally:
            await client.aclose()

    asyncio.run(main())
