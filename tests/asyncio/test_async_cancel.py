"""Cancellation at every await of an async acquire leaks nothing: no lease is left
held and no waiter left queued, whether the cancel lands before the request is
sent, while it is in flight, while queued, or as a release grants the lease.

The sweep counts event-loop iterations (``asyncio.sleep(0)``) before the cancel, so
it stops the acquire at each of its awaits in turn; a second sweep in microseconds
of wall time hits the grant that a release sends while the cancel arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial

import redis
import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.asyncio.primitive import LATE_CLEANUP
from celery_redislock.core.waiting import WAITER_HEARTBEAT_MS

Acquire = Callable[[], Awaitable[object]]


async def cancel_after(acquire: Acquire, yields: int) -> bool:
    """Start ``acquire()``, let the loop run ``yields`` times, cancel it; True when the
    cancel landed (the acquire had not returned)."""
    task = asyncio.ensure_future(acquire())
    for _ in range(yields):
        await asyncio.sleep(0)
    landed = task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        return landed
    release = getattr(lease, "release", None)
    if release is not None:
        await release()  # returned before the cancel: give it back ourselves
    return False


async def leftovers(
    client: aioredis.Redis, lock: AsyncRedisLock | AsyncRedisSemaphore, holders: int
) -> list[str]:
    """What the cancelled acquires left behind beyond ``holders`` live leases."""
    found = []
    info = await lock.info()
    if len(info.holders) != holders:
        found.append(f"{len(info.holders)} holders, expected {holders}")
    queued = await client.zcard(lock.keys.queue)
    if queued:
        found.append(f"{queued} queued waiters")
    return found


async def settled(
    client: aioredis.Redis, lock: AsyncRedisLock | AsyncRedisSemaphore, holders: int
) -> list[str]:
    """:func:`leftovers` once the clean-up is done: a request cancelled in flight may
    reach Redis after the first pass (its waiter queued again); the late pass, run
    ``LATE_CLEANUP`` s later, removes it. Waited for well short of the 5 s after which
    a lapsed heartbeat would drop the waiter anyway: the clean-up is what is proven."""
    within = LATE_CLEANUP + 2.0
    assert within < WAITER_HEARTBEAT_MS / 1000
    deadline = time.monotonic() + within
    while (found := await leftovers(client, lock, holders)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return found


def test_cancel_at_every_await_of_an_uncontended_and_a_queued_acquire(redis_url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        await client.flushdb()
        try:
            for lock in (
                AsyncRedisLock(client, "c-lock", ttl=10),
                AsyncRedisSemaphore(client, "c-sem", limit=1, ttl=10),
            ):
                landed = 0
                for contended in (False, True):
                    blocker = await lock.acquire() if contended else None
                    for yields in range(0, 40):
                        landed += await cancel_after(partial(lock.acquire, timeout=5), yields)
                        assert await settled(client, lock, int(contended)) == [], yields
                    if blocker is not None:
                        assert await blocker.release()
                assert landed >= 40  # most cancels hit an acquire still in progress
                await asyncio.sleep(LATE_CLEANUP + 0.1)  # the second clean-up pass too
                assert await leftovers(client, lock, 0) == []
        finally:
            await client.aclose()

    asyncio.run(main())


def test_cancel_racing_a_release_that_grants_the_waiter(redis_url: str) -> None:
    """The holder releases (granting the queued waiter, named in the release's reply: one
    loop) while the waiter is cancelled, swept from 1 ms before to 1 ms after: the grant
    is given back."""

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        await client.flushdb()
        try:
            for lock in (
                AsyncRedisLock(client, "r-lock", ttl=10),
                AsyncRedisSemaphore(client, "r-sem", limit=1, ttl=10),
            ):
                for step in range(-10, 11):
                    blocker = await lock.acquire()
                    assert blocker is not None
                    waiter = asyncio.ensure_future(lock.acquire(timeout=5))
                    while (await lock.info()).waiters == 0:
                        await asyncio.sleep(0.001)
                    release = asyncio.ensure_future(blocker.release())
                    await asyncio.sleep(max(0.0, step / 10_000 + 0.0005))
                    waiter.cancel()
                    await release
                    try:
                        lease = await waiter
                    except asyncio.CancelledError:
                        pass
                    else:
                        assert lease is not None and await lease.release()
                    assert await leftovers(client, lock, 0) == [], step
        finally:
            await client.aclose()

    asyncio.run(main())


def test_asyncio_timeout_around_a_wait_leaves_nothing(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            lock = AsyncRedisLock(client, "t-lock", ttl=10)
            blocker = await lock.acquire()
            assert blocker is not None
            started = time.monotonic()
            try:
                async with asyncio.timeout(0.3):
                    await lock.acquire()
            except TimeoutError:
                pass
            assert 0.25 < time.monotonic() - started < 1.0
            assert await leftovers(client, lock, 1) == []
            assert await blocker.release()
        finally:
            await client.aclose()

    asyncio.run(main())
