"""AsyncRedisRateLimiter: the sync limiter's scripts and decisions, awaited; sync and
async clients of one name share one limit (issue #25)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import ConfigurationError, RedisRateLimiter

if sys.version_info < (3, 11):
    pytest.skip("celery_redislock.asyncio needs Python 3.11+", allow_module_level=True)

from celery_redislock.asyncio import AsyncRedisRateLimiter


def test_async_twin_shares_the_limit_and_sleeps_until_admitted(
    r: redis.Redis, redis_url: str
) -> None:
    sync = RedisRateLimiter(r, "api", rate="10/s")

    async def main() -> None:
        pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=32)
        client = aioredis.Redis(connection_pool=pool)
        try:
            await body(aioredis.Redis(connection_pool=pool))
        finally:
            await client.aclose()
            await pool.aclose()

    async def body(client: aioredis.Redis) -> None:
        limiter = AsyncRedisRateLimiter(client, "api", rate="10/s")
        assert all(sync.acquire(blocking=False) for _ in range(4))
        # Sixteen tasks: six now, the rest a period later (two bursts, nothing polled).
        admitted: list[float] = []

        async def one() -> None:
            assert await limiter.acquire(timeout=5)
            admission = limiter.last_admission  # this task's own
            assert admission is not None
            admitted.append(admission.at)

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(16)))
        assert 0.8 < time.monotonic() - started < 3.0
        first = sync.info().server_time - 5
        assert len([t for t in admitted if t > first]) == 16
        admitted.sort()
        assert all(admitted[i + 10] - admitted[i] >= 1.0 for i in range(len(admitted) - 10))
        assert not await limiter.acquire(blocking=False)
        assert 0 < await limiter.retry_after() <= 1.01
        assert await limiter.acquire(2, timeout=5)
        assert await limiter.adjust(-1) == -1
        end = await limiter.penalize(0.3)
        assert (await limiter.info()).penalty_left > 0 and end > first
        await limiter.override("100/s", 5)
        assert (await limiter.info()).override == "100/s"
        await limiter.clear_override()
        await limiter.reset()
        assert await limiter.retry_after() == 0.0  # charges and penalty forgotten
        with pytest.raises(ConfigurationError, match="cost"):
            await limiter.acquire(0)

    asyncio.run(main())


def test_async_needs_an_async_client(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match=r"client must be a redis\.asyncio"):
        AsyncRedisRateLimiter(r, "api", rate="1/s")
