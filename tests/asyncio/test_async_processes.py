"""Sync and async clients in separate processes on one lock: mutual exclusion
(interval sweep), fences in grant order, no starvation; a killed async holder's
lease passes on after its TTL."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisLock

from ..core.test_lock_concurrency import overlaps
from . import _workers as workers

spawn = multiprocessing.get_context("spawn")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_no_overlap_with_eight_processes_mixing_sync_and_async(
    r: redis.Redis, redis_url: str
) -> None:
    go, out = spawn.Barrier(9), spawn.Queue()
    bodies = [workers.sync_sections, workers.async_sections] * 4
    procs = [
        spawn.Process(target=body, args=(redis_url, "mixed", 2.0, 0.001, go, out))
        for body in bodies
    ]
    for proc in procs:
        proc.start()
    go.wait(30)
    per_worker = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0
    sections = sorted(row for rows in per_worker for row in rows)
    assert len(sections) >= 8 * 5
    assert overlaps([(start, end) for start, end, _, _ in sections]) == 0
    assert all(ok for *_, ok in sections), "a lease was lost"
    fences = [fence for _, _, fence, _ in sections]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)  # grant order
    assert min(len(rows) for rows in per_worker) > 0, [len(rows) for rows in per_worker]


@pytest.mark.timeout(60)
def test_a_killed_async_holder_passes_the_lock_on_after_its_ttl(
    r: redis.Redis, redis_url: str
) -> None:
    ttl = 1.0
    ready = spawn.Queue()
    proc = spawn.Process(target=workers.hold_and_die, args=(redis_url, "orphan", ttl, ready))
    proc.start()
    dead_fence = ready.get(timeout=30)
    workers.kill(proc.pid or 0)
    proc.join(10)
    killed_at = time.monotonic()

    async def main() -> tuple[int, float]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            lock = AsyncRedisLock(client, "orphan", ttl=5)
            assert await lock.acquire(blocking=False) is None  # still held by the dead
            lease = await lock.acquire(timeout=ttl + 3)
            assert lease is not None
            waited = time.monotonic() - killed_at
            await lease.release()
            return lease.fence, waited
        finally:
            await client.aclose()

    fence, waited = asyncio.run(main())
    assert fence > dead_fence
    assert waited <= ttl + 1.5  # within a poll of the expiry
