"""The rate limiter on a real Redis Cluster (issue #25): every key of a limiter (log,
state, an adjust's done key) shares its hash tag, so each script runs on the node
that owns it, through sync and async cluster clients alike."""

from __future__ import annotations

import asyncio
import sys
from importlib import resources

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from celery_redislock import RedisRateLimiter
from celery_redislock.core.parking import RateCapacity
from celery_redislock.testing_cluster import LocalCluster


def test_rate_limiter_on_a_cluster(
    cluster: LocalCluster, rc: RedisCluster, name: str, ran: set[str]
) -> None:
    limiter = RedisRateLimiter(rc, name, rate=["3/s", "5/10s"])
    assert all(limiter.acquire(blocking=False) for _ in range(3))
    assert not limiter.acquire(blocking=False)
    assert 0.5 < limiter.retry_after() <= 1.01
    assert limiter.adjust(-1) == -1  # three keys: log, state, done
    assert limiter.acquire(blocking=False)
    assert limiter.penalize(0.2) > 0
    limiter.override("100/s", 5)
    info = limiter.info()
    assert info.override == "100/s" and info.penalty_left > 0
    limiter.reset()
    limiter.clear_override()
    assert limiter.acquire(blocking=False)
    # A parked run whose body started late moves its take's charge (ratelimit_late.lua,
    # #25): the take's done key shares the limiter's hash tag. No take noted here, so
    # the run is charged once more.
    capacity = RateCapacity(rc, name, rate=["3/s", "5/10s"])
    used = limiter.info().active[0].used
    assert capacity.charge_late("entry", "owner") is False
    assert limiter.info().active[0].used == used + 1
    scripts = {entry.name for entry in resources.files("celery_redislock.core.lua").iterdir()}
    assert ran >= {script for script in scripts if script.startswith("ratelimit_")}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="celery_redislock.asyncio needs 3.11+")
def test_async_rate_limiter_on_a_cluster(
    cluster: LocalCluster, rc: RedisCluster, name: str
) -> None:
    from celery_redislock.asyncio import AsyncRedisRateLimiter

    sync = RedisRateLimiter(rc, name, rate="2/s")
    assert sync.acquire(blocking=False)

    async def main() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.running()[0].port)
        try:
            limiter = AsyncRedisRateLimiter(client, name, rate="2/s")
            assert await limiter.acquire(blocking=False)  # shares the sync one's limit
            assert not await limiter.acquire(blocking=False)
            assert await limiter.acquire(timeout=3)
            assert await limiter.adjust(-1) == -1
        finally:
            await client.aclose()

    asyncio.run(main())
