"""The asyncio twin (Python >= 3.11): one API cap shared with the sync core and Celery.

Shown in docs/guides/asyncio.md; run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

import asyncio

# --8<-- [start:async]
import os

import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore

client = aioredis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
api = AsyncRedisSemaphore(client, "stripe-api", limit=10, ttl=30, renew=True)


async def call_partner(n: int) -> int:
    async with api as lease:  # waits in the same FIFO as the Celery workers
        await asyncio.sleep(0.01)  # await post(..., fence=lease.fence)
        return lease.fence


async def nightly_report() -> None:
    lock = AsyncRedisLock(client, "nightly-report", ttl=30)
    lease = await lock.acquire(timeout=5, owner="report-7")  # None when not granted in time
    if lease is not None:
        try:
            await lease.extend(60)
        finally:
            await lease.release()


# --8<-- [end:async]


async def run() -> None:
    fences = await asyncio.gather(*(call_partner(n) for n in range(50)))
    assert len(set(fences)) == 50  # every permit a grant of its own
    await nightly_report()
    await client.aclose()


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
