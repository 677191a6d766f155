"""AsyncRedisLock / AsyncRedisSemaphore on a real redis-server: the sync core's
semantics through redis.asyncio, and sync and async clients on one name."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import ConfigurationError, LockNotOwned, RedisLock, RedisSemaphore
from celery_redislock.asyncio import AsyncLease, AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.errors import RedisLockError
from tests.faults import FaultProxy

T = TypeVar("T")


def run(redis_url: str, body: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    """Run ``body(client)`` in a fresh event loop with its own async client."""

    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.fixture
def url(r: redis.Redis, redis_url: str) -> Iterator[str]:
    """The test Redis's URL, its database emptied (by ``r``)."""
    yield redis_url


def test_acquire_release_fence_and_info(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "a", ttl=5)
        first = await lock.acquire()
        assert isinstance(first, AsyncLease) and await lock.locked()
        info = await lock.info()
        assert info.held and info.fence == first.fence and info.waiters == 0
        assert await lock.acquire(blocking=False) is None
        lease, holder = await lock.try_acquire()
        assert lease is None and holder is None
        assert await first.release() and not await first.release()
        second = await lock.acquire(owner="o")
        assert second is not None and second.fence > first.fence
        again = await lock.acquire(blocking=False, owner="o")  # counted re-entry
        assert again is not None and again.fence > second.fence
        assert (await lock.try_acquire(owner="p")) == (None, "o")
        assert await second.extend(10) and await second.held()
        assert await again.release() and await lock.locked()
        assert await second.release() and not await lock.locked()

    run(url, body)


def test_async_with_releases_on_exit_and_on_cancel(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "with", ttl=5)
        async with lock as lease:
            assert await lock.locked() and not lease.released
        assert lease.released and not await lock.locked()

        entered = asyncio.Event()

        async def holder() -> None:
            async with lock:
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(holder())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await lock.locked()

    run(url, body)


def test_lost_lease_raises_on_exit(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "lost", ttl=5)
        with pytest.raises(LockNotOwned):
            async with lock:
                await lock.force_release()

    run(url, body)


def test_sync_and_async_exclude_and_hand_off(url: str) -> None:
    sync_lock = RedisLock(redis.Redis.from_url(url), "shared", ttl=5)

    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "shared", ttl=5)
        held = sync_lock.acquire()
        assert held is not None
        waiter = asyncio.create_task(lock.acquire(timeout=5))
        await asyncio.sleep(0.2)
        assert not waiter.done() and (await lock.info()).waiters == 1
        started = time.monotonic()
        await asyncio.to_thread(held.release)
        lease = await waiter
        assert lease is not None and lease.fence > held.fence
        assert time.monotonic() - started < 0.5  # woken, not polled
        # ... and back: a sync waiter gets it from the async holder.
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(sync_lock.acquire(timeout=5)))
        thread.start()
        await asyncio.sleep(0.2)
        assert not got
        assert await lease.release()
        await asyncio.to_thread(thread.join, 5)
        assert got and got[0] is not None and got[0].fence > lease.fence
        got[0].release()

    run(url, body)


def test_semaphore_limit_shared_with_sync_clients(url: str) -> None:
    sync_sem = RedisSemaphore(redis.Redis.from_url(url), "api", limit=3, ttl=5)

    async def body(client: aioredis.Redis) -> None:
        sem = AsyncRedisSemaphore(client, "api", limit=3, ttl=5)
        mine = [await sem.acquire(blocking=False) for _ in range(2)]
        theirs = sync_sem.acquire(blocking=False)
        assert all(mine) and theirs is not None
        assert await sem.acquire(blocking=False) is None and await sem.available() == 0
        waiter = asyncio.create_task(sem.acquire(timeout=5))
        await asyncio.sleep(0.1)
        await asyncio.to_thread(theirs.release)  # the sync release grants the async waiter
        lease = await waiter
        assert lease is not None and lease.fence > theirs.fence
        for held in [*mine, lease]:
            assert held is not None and await held.release()
        assert (await sem.info()).holders == []

    run(url, body)


def test_renewal_keeps_the_lease_and_reports_loss_within_a_tick(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "renewed", ttl=0.3, renew=True)
        reported: list[AsyncLease] = []
        lease = await lock.acquire(on_lost=reported.append)
        assert lease is not None
        await asyncio.sleep(1.0)  # three TTLs: only renewal keeps it
        assert not lease.lost and await lease.held()
        await client.delete(lock.keys.holders)  # taken away behind its back
        found_at = time.monotonic()
        assert await lease.wait_lost(1.0)
        assert time.monotonic() - found_at <= 0.3  # within one tick (TTL/3) and a reply
        assert reported == [lease] and lease.lost_event.is_set()
        assert "no longer held" in lease.lost_reason

    run(url, body)


def test_a_lease_used_from_another_loop_raises(url: str) -> None:
    leases: list[AsyncLease] = []

    async def take(client: aioredis.Redis) -> None:
        lease = await AsyncRedisLock(client, "loop", ttl=5).acquire()
        assert lease is not None
        leases.append(lease)

    run(url, take)

    async def other(client: aioredis.Redis) -> None:
        with pytest.raises(RedisLockError, match="event loop"):
            await leases[0].release()

    run(url, other)


def test_a_sync_client_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"redis\.asyncio"):
        AsyncRedisLock(redis.Redis.from_url(url), "x")
    with pytest.raises(ConfigurationError, match="limit"):
        AsyncRedisSemaphore(aioredis.Redis.from_url(url), "x", limit=0)


def test_one_subscriber_connection_per_loop_for_all_its_waiters(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "many-waiters", ttl=5)
        held = await lock.acquire()
        assert held is not None
        waiters = [asyncio.create_task(lock.acquire(timeout=5)) for _ in range(20)]
        while (await lock.info()).waiters < 20:
            await asyncio.sleep(0.01)
        listing = await client.client_list()
        subscribers = [c for c in listing if int(c.get("sub", 0)) or "P" in c.get("flags", "")]
        assert len(subscribers) == 1, subscribers
        # FIFO hand-off through the shared connection: each release grants the next.
        leases = [held]
        for _ in range(20):
            assert await leases[-1].release()
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1
            task = done.pop()
            waiters.remove(task)
            lease = task.result()
            assert lease is not None and lease.fence > leases[-1].fence
            leases.append(lease)
        assert await leases[-1].release()

    run(url, body)


def test_per_loop_state_dies_with_its_loop(url: str) -> None:
    import gc
    import weakref

    from celery_redislock.asyncio import notifier, renewal

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def body(client: aioredis.Redis) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        lock = AsyncRedisLock(client, "per-loop", ttl=1)
        lease = await lock.acquire(renew=True)  # the loop's renewer
        assert lease is not None
        assert await lock.acquire(timeout=0.2) is None  # the loop's subscriber
        assert await lease.release()

    for _ in range(3):
        run(url, body)
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
    assert len(notifier._registry) == 0 and len(renewal._renewers) == 0


def test_extend_of_a_renewed_lease_is_kept_and_renewed_at_the_new_length(url: str) -> None:
    async def body(client: aioredis.Redis) -> None:
        lock = AsyncRedisLock(client, "ext", ttl=0.6, renew=True)
        lease = await lock.acquire()
        assert lease is not None
        assert await lease.extend(3.0)  # a new generation: renewals go on at 3 s
        await asyncio.sleep(1.0)
        assert not lease.lost and lease.ttl == 3.0
        assert await client.pttl(lock.keys.holders) > 1500
        assert await lease.extend(2.0, add=True)
        assert await client.pttl(lock.keys.holders) > 3500
        assert await lease.release()

    run(url, body)


def test_an_extend_confirmed_after_the_ttl_it_set_is_no_confirmation(
    url: str, fault_proxy: FaultProxy
) -> None:
    # The sync lease's rule (tests/core/test_lock.py), from the one shared LeaseState:
    # a reply >= 0.3 s after the send (0.15 s each way) to an extend that set 0.2 s is
    # no confirmation. Before: True with remaining() below zero; after: False and lost.
    async def main() -> None:
        client = aioredis.Redis(host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db)
        try:
            lock = AsyncRedisLock(client, "late", ttl=5)
            lease = await lock.acquire()
            assert lease is not None
            assert await lease.extend(5)  # the script loaded: one round trip below
            fault_proxy.delay = 0.15
            extended = await lease.extend(0.2)
            left = lease.remaining()
            assert not extended, f"extend() True with {left:.3f} s left"
            assert lease.lost and "after the TTL it set ran out" in lease.lost_reason
        finally:
            fault_proxy.delay = 0.0
            await client.aclose()

    asyncio.run(main())
