"""The async twin has the sync classes' API (#30 items 2, 6): ``hold()`` on the async
lock and semaphore, and ``restart_grace`` -- a renewing async holder keeps its lock
(or permit) when its Redis restarts empty, and nobody else takes it meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.errors import ConfigurationError, LockNotOwned, LockTimeout, RedisRestarting
from celery_redislock.testing import RedisServer

TTL = 1.5


def test_hold_acquires_with_options_and_raises_when_not_granted(
    r: redis.Redis, redis_url: str
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            lock = AsyncRedisLock(client, "hold", ttl=5)
            async with lock.hold(owner="first", ttl=3) as lease:
                assert lease.owner == "first" and lease.ttl == 3
                assert (await lock.info()).owner == "first"
                with pytest.raises(LockTimeout) as refused:
                    async with lock.hold(blocking=False, owner="second"):
                        raise AssertionError("the block ran without the lease")
                assert refused.value.holder == "first" and "without waiting" in str(refused.value)
                started = time.monotonic()
                with pytest.raises(LockTimeout, match=r"within 0\.2 s"):
                    async with lock.hold(timeout=0.2):
                        raise AssertionError("the block ran without the lease")
                assert time.monotonic() - started >= 0.2
            assert lease.released and not await lock.locked()
            # Lost in the block: leaving it raises, as for the sync hold().
            with pytest.raises(LockNotOwned):
                async with lock.hold() as lease:
                    await lock.force_release()
            sem = AsyncRedisSemaphore(client, "hold-sem", limit=1, ttl=5)
            async with sem.hold(owner="a") as permit:
                assert permit.owner == "a"
                with pytest.raises(LockTimeout, match="semaphore 'hold-sem'"):
                    async with sem.hold(blocking=False):
                        raise AssertionError("the block ran without the permit")
            assert await sem.available() == 1
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


def _async_client(server: RedisServer) -> aioredis.Redis:
    return aioredis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=0.5)


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=0.5)


def test_restart_grace_is_validated(server: RedisServer) -> None:
    async def main() -> None:
        client = _async_client(server)
        try:
            for bad in (0, -1, "5", 0.001):
                with pytest.raises(ConfigurationError, match="restart_grace"):
                    AsyncRedisLock(client, "lock", restart_grace=bad)  # type: ignore[arg-type]
                with pytest.raises(ConfigurationError, match="restart_grace"):
                    AsyncRedisSemaphore(client, "s", limit=1, restart_grace=bad)  # type: ignore[arg-type]
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("grace", [True, None], ids=["grace", "no-grace"])
def test_a_renewing_async_lock_holder_keeps_its_lock_across_a_restart(
    server: RedisServer, grace: bool | None
) -> None:
    other = RedisLock(_client(server), "job", ttl=TTL, restart_grace=grace)

    async def main() -> None:
        client = _async_client(server)
        try:
            lock = AsyncRedisLock(client, "job", ttl=TTL, restart_grace=grace)
            lease = await lock.acquire(blocking=False, owner="first", renew=True)
            assert lease is not None
            assert other.try_acquire(owner="second") == (None, "first")  # marks it too
            server.restart()  # SIGKILL, then an empty server on the same port
            holders = set()
            deadline = time.monotonic() + 2.5 * TTL
            while time.monotonic() < deadline:
                try:  # in the grace and free: unknown; once put back: held by its owner
                    granted, holder = await asyncio.to_thread(other.try_acquire, owner="second")
                except RedisRestarting:
                    holders.add("restarting")
                    granted, holder = None, None
                if granted is not None:
                    holders.add("second")
                    assert granted.release()
                else:
                    holders.add(holder)
                await asyncio.sleep(0.05)
            if grace:
                assert "second" not in holders and "first" in holders
                assert not lease.lost, lease.lost_reason
                assert await lease.release()
            else:
                assert "second" in holders  # no grace: a second holder got in
                assert await lease.wait_lost(3 * TTL)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_renewing_async_semaphore_holders_keep_their_permits_across_a_restart(
    server: RedisServer,
) -> None:
    newcomer = RedisSemaphore(_client(server), "pool", limit=2, ttl=TTL, restart_grace=True)

    async def main() -> None:
        client = _async_client(server)
        try:
            sem = AsyncRedisSemaphore(client, "pool", limit=2, ttl=TTL, restart_grace=True)
            leases = [await sem.acquire(blocking=False, renew=True) for _ in range(2)]
            assert all(lease is not None for lease in leases)
            assert newcomer.acquire(blocking=False) is None  # marks the server too
            server.restart()
            deadline = time.monotonic() + 2.5 * TTL
            while time.monotonic() < deadline:
                assert await asyncio.to_thread(newcomer.acquire, blocking=False) is None
                await asyncio.sleep(0.1)
            for lease in leases:
                assert lease is not None and not lease.lost, lease.lost_reason
                assert await lease.release()
        finally:
            await client.aclose()

    asyncio.run(main())
