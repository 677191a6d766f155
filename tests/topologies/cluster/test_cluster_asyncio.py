"""celery_redislock.asyncio on a real Redis Cluster through redis.asyncio's
RedisCluster: grants, a hand-off from a sync cluster client to an async waiter,
renewal of leases in several hash slots."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

if sys.version_info < (3, 11):
    pytest.skip("celery_redislock.asyncio needs Python 3.11+", allow_module_level=True)

from celery_redislock import RedisLock
from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.testing_cluster import LocalCluster


def test_async_lock_and_semaphore_on_a_cluster(
    cluster: LocalCluster, rc: RedisCluster, name: str
) -> None:
    sync_lock = RedisLock(rc, name, ttl=5)

    async def main() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.running()[0].port)
        try:
            lock = AsyncRedisLock(client, name, ttl=5)
            held = sync_lock.acquire()
            assert held is not None
            waiter = asyncio.create_task(lock.acquire(timeout=5))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            started = time.monotonic()
            await asyncio.to_thread(held.release)
            lease = await waiter
            assert lease is not None and lease.fence > held.fence
            assert time.monotonic() - started < 1.5  # woken (or granted) before a poll
            assert await lease.release()

            sem = AsyncRedisSemaphore(client, f"{name}-sem", limit=2, ttl=5)
            permits = [await sem.acquire(blocking=False) for _ in range(3)]
            assert permits[0] and permits[1] and permits[2] is None
            for permit in permits[:2]:
                assert permit is not None and await permit.release()

            # Renewal: leases in several slots, each renewed past its TTL.
            renewed = [
                await AsyncRedisLock(client, f"{name}-{i}", ttl=0.5).acquire(renew=True)
                for i in range(6)
            ]
            await asyncio.sleep(1.2)
            for r in renewed:
                assert r is not None and not r.lost and await r.held()
                assert await r.release()
        finally:
            await client.aclose()

    asyncio.run(main())
