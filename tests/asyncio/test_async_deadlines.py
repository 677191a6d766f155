"""The async acquire keeps its deadline while Redis does not answer, as the sync one
does (tests/core/test_deadlines.py): a blocked read never outlives ``timeout``."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from tests.faults import FaultProxy


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_an_async_waiter_returns_by_its_deadline_while_redis_is_paused(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str
) -> None:
    holder = (
        RedisLock(r, "job") if kind == "lock" else RedisSemaphore(r, "job", limit=1)
    ).acquire()
    assert holder is not None

    async def main() -> float:
        client = aioredis.Redis.from_url(fault_proxy.url)  # no socket timeout at all
        primitive = (
            AsyncRedisLock(client, "job")
            if kind == "lock"
            else AsyncRedisSemaphore(client, "job", limit=1)
        )
        try:
            assert await primitive.acquire(blocking=False) is None  # connected, cached
            await asyncio.sleep(0.1)
            fault_proxy.pause()  # Redis stops answering (as when SIGSTOPped)
            started = time.monotonic()
            try:
                with pytest.raises(redis.TimeoutError):
                    await primitive.acquire(timeout=1.0)
            finally:
                elapsed = time.monotonic() - started
                fault_proxy.resume()
            return elapsed
        finally:
            await client.aclose()

    elapsed = asyncio.run(main())
    # Before: the read waited for ever (redis.asyncio has no socket timeout by default).
    assert elapsed < 1.5 + 1.0, elapsed  # the deadline, then the clean-up's grace (2 x 0.5 s)
    assert holder.release()
