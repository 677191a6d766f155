"""The async script calls (celery_redislock.asyncio.calls, through redis.asyncio's
public API): the connection each loop keeps of a pool, a write too large for the
socket at once, a connection the server closed, timeouts and lost replies, and what
an uncontended acquire leaves alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from celery_redislock import RedisLock
from celery_redislock.asyncio import AsyncRedisLock, calls, renewal
from celery_redislock.asyncio.calls import SPARE_MIN_POOL
from celery_redislock.asyncio.notifier import AsyncNotifier
from celery_redislock.core.lock_scripts import ACQUIRE, RELEASE
from tests.faults import FaultProxy


async def cycles(client: aioredis.Redis, count: int) -> None:
    """``count`` concurrent acquire + release cycles on as many names."""

    async def one(i: int) -> None:
        async with AsyncRedisLock(client, f"calls:{i}", ttl=5):
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one(i) for i in range(count)))


@contextlib.asynccontextmanager
async def pooled(
    redis_url: str, max_connections: int, timeout: float = 2
) -> AsyncIterator[aioredis.Redis]:
    """A client on a blocking pool of ``max_connections``, both closed at the end."""
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url, max_connections=max_connections, timeout=timeout
    )
    client = aioredis.Redis(connection_pool=pool)
    try:
        yield client
    finally:
        await client.aclose()
        await pool.aclose()


def test_a_loop_keeps_at_most_one_connection_of_a_pool(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        async with pooled(redis_url, SPARE_MIN_POOL) as client:
            await cycles(client, 30)
            # Every connection but one is the user's again: as many blocking reads.
            reads = [client.blpop(["calls:none"], 0.3) for _ in range(SPARE_MIN_POOL - 1)]
            assert await asyncio.gather(*reads) == [None] * (SPARE_MIN_POOL - 1)
            await cycles(client, 5)  # and the kept one still works

    asyncio.run(main())


def test_a_small_pool_keeps_every_connection_for_its_user(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        async with pooled(redis_url, 1) as client:
            await cycles(client, 3)
            assert await client.blpop(["calls:none"], 0.1) is None  # not waiting for a slot

    asyncio.run(main())


def test_a_write_larger_than_the_socket_takes_is_awaited(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        owner = "o" * 8_000_000  # more than a socket buffer: the write waits to drain
        try:
            lock = AsyncRedisLock(client, "calls:big", ttl=5)
            lease = await lock.acquire(blocking=False, owner=owner)
            assert lease is not None and (await lock.info()).owner == owner
            assert await lease.release()
            assert not await lock.locked()
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_kept_connection_the_server_closed_is_not_used(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        # No retries: a call on the closed connection would fail, not retry.
        client = aioredis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 0))
        try:
            await cycles(client, 1)
            assert r.client_kill_filter(_type="normal", skipme=True) >= 1
            await asyncio.sleep(0.1)  # the loop sees the connection closed
            await cycles(client, 3)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_an_uncontended_acquire_makes_no_subscriber_and_no_renewer(
    r: redis.Redis, redis_url: str
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            async with AsyncRedisLock(client, "calls:plain", ttl=5):  # blocking, not renewed
                pass
            assert await AsyncRedisLock(client, "calls:plain").acquire(timeout=1) is not None
            assert AsyncNotifier.current(client) is None
            assert asyncio.get_running_loop() not in renewal._renewers
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_read_past_the_socket_timeout_raises_and_closes(fault_proxy: FaultProxy) -> None:
    async def main() -> float:
        client = aioredis.Redis.from_url(
            fault_proxy.url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        try:
            # Reads for longer than the socket timeout: the connection's one timer
            # fires while later reads are in progress and waits on for them.
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                lease = await AsyncRedisLock(client, "calls:slow").acquire(blocking=False)
                assert lease is not None and await lease.release()
            fault_proxy.pause()  # Redis stops answering
            started = time.monotonic()
            try:
                with pytest.raises(redis.TimeoutError):
                    await AsyncRedisLock(client, "calls:slow").acquire(blocking=False)
            finally:
                elapsed = time.monotonic() - started
                fault_proxy.resume()
            # The timed-out connection was closed: the next call gets its own reply.
            lease = await AsyncRedisLock(client, "calls:after").acquire(blocking=False)
            assert lease is not None and await lease.release()
            return elapsed
        finally:
            await client.aclose()

    elapsed = asyncio.run(main())
    # The read, then the clean-up's grace (two calls of at most 0.5 s): not less
    # than the timeout either (a timer left from an earlier read must not cut it).
    assert 0.3 <= elapsed < 0.3 + 1.0 + 1.0, elapsed


def test_a_call_gives_its_connection_back_with_the_users_socket_timeout(
    fault_proxy: FaultProxy,
) -> None:
    """A call bounds its send and read by the connection's socket timeout itself (see
    calls._once): whatever ends it -- a reply, the timeout, a cancellation -- the
    connection has the user's timeout again before anyone else can use it."""

    async def main() -> None:
        pool = aioredis.ConnectionPool.from_url(
            fault_proxy.url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        client = aioredis.Redis(connection_pool=pool)

        async def timeouts(pooled: bool = True) -> set[float | None]:
            # The loop's kept connection, and the pool's next one (the last given
            # back; a connection it makes while Redis is paused would time out).
            kept = calls._KEPT.get(pool)
            conns = [] if kept is None else [kept.conn()]
            if pooled:
                conns.append(await pool.get_connection())
                await pool.release(conns[-1])
            return {conn.socket_timeout for conn in conns if conn is not None}

        try:
            lease = await AsyncRedisLock(client, "calls:timeout").acquire(blocking=False)
            assert lease is not None and await lease.release()
            assert await timeouts() == {0.3}
            fault_proxy.pause()
            try:
                with pytest.raises(redis.TimeoutError):
                    await AsyncRedisLock(client, "calls:timeout").acquire(blocking=False)
                assert await timeouts(pooled=False) <= {0.3}
                task = asyncio.ensure_future(
                    AsyncRedisLock(client, "calls:x").acquire(blocking=False)
                )
                await asyncio.sleep(0.1)  # sent, no reply yet
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                fault_proxy.resume()
            await asyncio.sleep(0.3)  # a cancelled call's clean-up ends
            assert await timeouts() == {0.3}
        finally:
            await client.aclose()
            await pool.aclose()  # a pool given to the client is not closed by it

    asyncio.run(main())


def test_a_timeout_redis_py_sets_during_a_call_is_not_undone(fault_proxy: FaultProxy) -> None:
    """redis-py relaxes a connection's timeout during a server's maintenance, and puts
    it back after, with the connection's public set_tmp_settings / reset_tmp_settings
    (on a maintenance notification, read mid-call): a call clears the timeout while
    it runs (calls._OwnTimeout) and must not put its own value back over theirs."""

    async def main() -> None:
        pool = aioredis.ConnectionPool.from_url(
            fault_proxy.url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        client = aioredis.Redis(connection_pool=pool)

        async def call_while(change: str) -> None:
            fault_proxy.pause()  # the call is sent and waits for its reply
            task = asyncio.ensure_future(AsyncRedisLock(client, "calls:tmp").acquire())
            try:
                await asyncio.sleep(0.1)
                if change == "relax":
                    conn.set_tmp_settings(tmp_relaxed_timeout=2.0)
                else:
                    conn.reset_tmp_settings(reset_relaxed_timeout=True)
            finally:
                fault_proxy.resume()
            lease = await task
            assert lease is not None and await lease.release()

        try:
            lease = await AsyncRedisLock(client, "calls:tmp").acquire(blocking=False)
            assert lease is not None and await lease.release()
            kept = calls._KEPT[pool].conn()
            assert kept is not None
            conn = kept
            await call_while("relax")
            assert conn.socket_timeout == 2.0  # relaxed mid-call: kept (was put back to 0.3)
            await call_while("reset")
            assert conn.socket_timeout == 0.3  # reset mid-call: kept (was put back to 2.0)
        finally:
            await client.aclose()
            await pool.aclose()

    asyncio.run(main())


def test_a_lost_reply_is_sent_again_and_answered_as_the_first(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    for script in (ACQUIRE, RELEASE):
        r.script_load(script.text)  # the dropped reply is the script's, not NOSCRIPT

    async def main() -> None:
        # One retry (redis.asyncio's connections make none by default): it re-sends
        # the call on a new connection; the script runs twice.
        client = aioredis.Redis.from_url(fault_proxy.url, retry=Retry(NoBackoff(), 1))
        lock = AsyncRedisLock(client, "calls:lost")
        try:
            for script in (ACQUIRE, RELEASE):
                fault_proxy.drop_reply(match=script.sha.encode())
                async with lock as lease:  # exit raises LockNotOwned if not released
                    assert len([f for f in r.hkeys(lock.keys.holders) if f[:2] == b"t:"]) == 1
                assert lease.released and not lease.lost
                assert not r.exists(lock.keys.holders)
            assert fault_proxy.dropped == 2
            # As the sync lock's: no release record, the re-sent release that found
            # the lease gone judged by the lease's local deadline.
            assert not r.keys("*calls:lost*:done:*")
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_client_used_by_one_loop_after_another_gives_each_kept_connection_back(
    r: redis.Redis, redis_url: str
) -> None:
    # A module-level client, closed (its pool's connections closed) at the end of each
    # asyncio.run(): every loop keeps a connection, and the next loop gives the dead
    # loop's back to the pool (else the pool runs out after max_connections loops).
    client = aioredis.Redis.from_url(redis_url, max_connections=SPARE_MIN_POOL)

    async def job() -> None:
        try:
            await cycles(client, 2)
        finally:
            await client.aclose()

    for _ in range(SPARE_MIN_POOL + 5):
        asyncio.run(job())


def test_a_call_waiting_for_a_pool_connection_ends_by_its_deadline(
    r: redis.Redis, redis_url: str
) -> None:
    async def main() -> float:
        async with pooled(redis_url, 1, timeout=10) as client:
            busy = asyncio.ensure_future(client.blpop(["calls:none"], 3))  # the only one
            await asyncio.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError):  # DeadlinePassed
                await AsyncRedisLock(client, "calls:pool").acquire(timeout=0.3)
            elapsed = time.monotonic() - started
            assert await busy is None
            return elapsed

    elapsed = asyncio.run(main())
    assert elapsed < 0.3 + 2 * 0.6 + 0.8, elapsed  # the deadline, the clean-up's grace


def test_a_resent_release_of_a_lease_known_lost(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    r.script_load(RELEASE.text)

    async def main() -> None:
        client = aioredis.Redis.from_url(fault_proxy.url, retry=Retry(NoBackoff(), 1))
        try:
            lease = await AsyncRedisLock(client, "calls:forced").acquire()
            assert lease is not None
            RedisLock(r, "calls:forced").force_release()
            assert await lease.held() is False and lease.lost  # known lost
            fault_proxy.drop_reply(match=RELEASE.sha.encode())
            assert await lease.release() is False  # not taken for its own first send
            assert fault_proxy.dropped == 1
        finally:
            await client.aclose()

    asyncio.run(main())
