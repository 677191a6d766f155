"""The API-cap case in small (benchmarks/bench_asyncio.py runs 1,000 tasks): many tasks
of one loop through one AsyncRedisSemaphore -- never more than ``limit`` inside, every
task served; and renewal of many leases of a
loop in one script call per tick."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore, calls
from celery_redislock.core.semaphore_scripts import ACQUIRE


def script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def test_two_hundred_tasks_through_a_limit_of_ten(r: redis.Redis, redis_url: str) -> None:
    tasks, limit, hold = 200, 10, 0.005

    async def main() -> tuple[int, list[float], float]:
        pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=32)
        client = aioredis.Redis(connection_pool=pool)
        sem = AsyncRedisSemaphore(client, "cap", limit=limit, ttl=10)
        inside = peak = 0
        waits: list[float] = []

        async def task() -> None:
            nonlocal inside, peak
            asked = time.monotonic()
            async with sem:
                waits.append(time.monotonic() - asked)
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(hold)
                inside -= 1

        started = time.monotonic()
        await asyncio.gather(*(task() for _ in range(tasks)))
        elapsed = time.monotonic() - started
        await client.aclose()
        await pool.aclose()
        return peak, waits, elapsed

    peak, waits, elapsed = asyncio.run(main())
    assert peak == 10  # never more than the limit, and the limit used
    assert len(waits) == tasks  # nobody starved
    # Generous (CI shares 2 cores; benchmarks/bench_asyncio.py has the real figure), but
    # far below what polling alone would take (20 rounds x a 1 s poll): hand-offs work.
    assert elapsed < 10.0, elapsed
    assert r.zcard("redislock:semaphore:{cap}:holders") == 0
    assert r.zcard("redislock:semaphore:{cap}:queue") == 0


def test_a_loop_renews_all_its_leases_in_one_call_per_tick(r: redis.Redis, redis_url: str) -> None:
    ttl = 0.6  # a tick every 0.2 s

    async def main() -> int:
        client = aioredis.Redis.from_url(redis_url)
        leases = [
            await AsyncRedisLock(client, f"many-{i}", ttl=ttl).acquire(renew=True)
            for i in range(200)
        ]
        await asyncio.sleep(ttl / 3)  # the acquisition-time spread settles into one tick
        before = script_calls(r)
        await asyncio.sleep(1.0)  # five ticks
        calls = script_calls(r) - before
        assert all(lease is not None and not lease.lost for lease in leases)
        for lease in leases:
            assert lease is not None and await lease.release()
        await client.aclose()
        return calls

    calls = asyncio.run(main())
    assert calls <= 1.0 / (ttl / 3) + 2, calls  # one call per tick for 200 leases


def test_waiters_joining_at_once_share_one_subscriber_connection(redis_url: str) -> None:
    # Many waiters of a loop subscribe at the same moment: one SUBSCRIBE in flight, so
    # the subscriber takes one pooled connection (redis.asyncio's PubSub.connect, run
    # concurrently, takes one per caller and keeps the last: a small blocking pool was
    # exhausted and every task hung until the pool's timeout).
    async def main() -> int:
        pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=4, timeout=3)
        client = aioredis.Redis(connection_pool=pool)
        sem = AsyncRedisSemaphore(client, "joined", limit=1, ttl=10)
        done = 0

        async def task() -> None:
            nonlocal done
            lease = await sem.acquire(timeout=30)  # a deadline: each call is a task
            assert lease is not None
            await asyncio.sleep(0.001)
            await lease.release()
            done += 1

        await asyncio.gather(*(task() for _ in range(40)))
        await client.aclose()
        await pool.aclose()
        return done

    assert asyncio.run(main()) == 40


def test_a_loop_s_own_releases_grant_its_waiters_without_a_message(
    r: redis.Redis, redis_url: str
) -> None:
    async def main() -> int:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "local", limit=2, ttl=10)
        done = 0

        async def task() -> None:
            nonlocal done
            async with sem:
                await asyncio.sleep(0.002)
            done += 1

        await asyncio.gather(*(task() for _ in range(30)))
        await client.aclose()
        return done

    before = int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))
    assert asyncio.run(main()) == 30
    # Every grant went to a waiter of the releasing loop: named in the release's reply.
    assert int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)) == before


def test_a_burst_s_first_limit_acquires_are_granted_in_one_write(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to ``limit`` acquires of a loop try before it subscribes, together: a burst's
    first ``limit`` permits are granted at once, not one before the subscription and
    the others after it."""

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "first-limit", limit=4, ttl=10)
        granted: list[float] = []

        async def task() -> None:
            lease = await sem.acquire(timeout=10)
            assert lease is not None
            granted.append(time.monotonic())
            await asyncio.sleep(0.05)
            await lease.release()

        await asyncio.gather(*(task() for _ in range(12)))
        assert granted[3] - granted[0] < 0.02  # the first four: one reply
        await client.aclose()

    asyncio.run(main())


def test_waiters_that_subscribed_first_queue_behind_the_loop_s_earlier_tries(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's first acquires try before the loop subscribes; the later ones subscribe
    first. Those tries' write is slow (its connection is new: the loop's kept one was in
    use): the later acquires still queue behind them, so the earlier get the permits
    freed first (FIFO within a loop, under redis-py 5.3 as under 8)."""
    send = calls.call
    slow = [True]

    async def late_first_tries(script: Any, client: Any, keys: Any, args: Any, *more: Any) -> Any:
        if script is ACQUIRE and slow:
            slow.clear()
            await asyncio.sleep(0.3)  # well past the subscription's confirmation
        return await send(script, client, keys, args, *more)

    monkeypatch.setattr(calls, "call", late_first_tries)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "tries-first", limit=2, ttl=10)
        held = [await sem.acquire(blocking=False) for _ in range(2)]
        queued = [asyncio.ensure_future(sem.acquire(timeout=10)) for _ in range(4)]
        while (await sem.info()).waiters < 4:
            await asyncio.sleep(0.01)
        assert all(await asyncio.gather(*(lease.release() for lease in held if lease)))
        first = await asyncio.wait_for(asyncio.gather(*queued[:2]), 2)  # handed over
        assert not any(task.done() for task in queued[2:])
        for lease in first:
            assert await lease.release()
        for lease in await asyncio.wait_for(asyncio.gather(*queued[2:]), 2):
            assert await lease.release()
        await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
def test_script_calls_over_either_protocol_and_decoding(
    redis_url: str, protocol: int, decode: bool
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
        sem = AsyncRedisSemaphore(client, f"replies-{protocol}-{decode}", limit=2, ttl=10)
        leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(5)))
        held = [lease for lease in leases if lease is not None]
        assert len(held) == 2 and held[0].fence != held[1].fence
        queued = asyncio.ensure_future(sem.acquire(timeout=5))
        while (await sem.info()).waiters < 1:
            await asyncio.sleep(0.01)
        assert all(await asyncio.gather(*(lease.release() for lease in held)))
        lease = await queued  # granted in a release's reply
        assert lease is not None and (await sem.info()).holders[0].fence == lease.fence
        assert await lease.release()
        await client.aclose()

    asyncio.run(main())
