"""A burst of acquire attempts of one loop goes out in one write per turn (asyncio/
batch.py): every attempt gets its own reply, a NOSCRIPT sends them again alone, and a
caller cancelled before the write is left out. So does a burst of semaphore releases,
each handing its own grant to this loop's waiter, even when the write's reply is lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import RedisSemaphore
from celery_redislock.asyncio import AsyncRedisSemaphore, batch
from celery_redislock.core.semaphore_scripts import ACQUIRE, RELEASE
from tests.asyncio import write_sizes
from tests.faults import FaultProxy


def test_a_burst_of_attempts_is_one_write_with_each_reply_its_own(
    r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = write_sizes(monkeypatch)

    async def main() -> list[Any]:
        client = aioredis.Redis.from_url(redis_url)  # a pool of 100 connections at most
        sem = AsyncRedisSemaphore(client, "burst", limit=7, ttl=10)
        leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(150)))
        for lease in leases:
            if lease is not None:
                assert await lease.release()
        await client.aclose()
        return leases

    granted = [lease for lease in asyncio.run(main()) if lease is not None]
    assert len(granted) == 7  # each reply went to its own call: 7 grants, 143 refusals
    assert len({lease.fence for lease in granted}) == 7
    assert sizes == [batch.MAX_BATCH, 150 - batch.MAX_BATCH]  # 150 calls, 2 writes
    assert r.zcard("redislock:semaphore:{burst}:holders") == 0


def test_noscript_in_a_burst_sends_each_attempt_again_alone(r: redis.Redis, redis_url: str) -> None:
    async def main() -> int:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "flushed", limit=3, ttl=10)
        await sem.acquire(blocking=False)  # scripts loaded...
        r.script_flush()  # ...and gone
        leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(20)))
        await client.aclose()
        return sum(lease is not None for lease in leases)

    assert asyncio.run(main()) == 2  # the first lease holds one of 3


def test_a_caller_cancelled_before_the_write_is_left_out(r: redis.Redis, redis_url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "left-out", limit=50, ttl=10)
        tasks = [asyncio.ensure_future(sem.acquire(blocking=False)) for _ in range(20)]
        await asyncio.sleep(0)  # each task queued its attempt for this turn's write
        for task in tasks[::2]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        kept = [lease for lease in results if not isinstance(lease, BaseException)]
        assert len(kept) == 10 and all(kept)
        for lease in kept:
            assert lease is not None and await lease.release()  # type: ignore[union-attr]
        await asyncio.sleep(0.5)  # the cancelled ones' clean-ups (and late ones) ran
        assert await client.zcard(sem.keys.holders) == 0
        await client.aclose()

    asyncio.run(main())


def test_a_burst_keeps_each_deadline_while_redis_is_paused(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    holder = RedisSemaphore(r, "paused", limit=1).acquire()
    assert holder is not None

    async def main() -> tuple[float, int]:
        client = aioredis.Redis.from_url(fault_proxy.url)  # no socket timeout at all
        sem = AsyncRedisSemaphore(client, "paused", limit=1)
        try:
            assert await sem.acquire(blocking=False) is None  # connected, script cached
            fault_proxy.pause()
            started = time.monotonic()
            try:
                outcomes = await asyncio.gather(
                    *(sem.acquire(timeout=1.0) for _ in range(20)), return_exceptions=True
                )
            finally:
                elapsed = time.monotonic() - started
                fault_proxy.resume()
            return elapsed, sum(isinstance(o, redis.TimeoutError) for o in outcomes)
        finally:
            await client.aclose()

    elapsed, timed_out = asyncio.run(main())
    assert timed_out == 20
    assert elapsed < 1.5 + 1.0, elapsed  # the deadline, then the clean-up's grace
    assert holder.release()


def test_a_burst_sent_again_alone_keeps_each_callers_own_deadline(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    """The batch's reply lost: each call is sent again alone under its own caller's
    deadline -- a call with none must not fail by the deadline of the call that
    happened to open the batch."""

    async def main() -> Any:
        client = aioredis.Redis(host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db)
        sem = AsyncRedisSemaphore(client, "mixed", limit=5, ttl=10)
        try:
            lease = await sem.acquire(blocking=False)  # connected, script cached
            assert lease is not None and await lease.release()
            fault_proxy.delay = 0.15
            fault_proxy.drop_reply(match=ACQUIRE.sha.encode())  # the batch's write
            outcomes = await asyncio.gather(
                sem.acquire(timeout=0.2),  # opens the batch
                sem.acquire(blocking=False),
                return_exceptions=True,
            )
            assert fault_proxy.dropped == 1
            return outcomes[1]
        finally:
            fault_proxy.delay = 0.0
            await client.aclose()

    second = asyncio.run(main())
    assert not isinstance(second, BaseException), repr(second)
    assert second is not None  # five permits free: the attempt without a deadline got one


async def _hold_and_queue(sem: AsyncRedisSemaphore, waiters: int) -> tuple[list[Any], list[Any]]:
    """``sem.limit`` leases held and ``waiters`` tasks queued behind them (subscribed)."""
    held = [await sem.acquire(blocking=False) for _ in range(sem.limit)]
    queued = [asyncio.ensure_future(sem.acquire(timeout=10)) for _ in range(waiters)]
    while (await sem.info()).waiters < waiters:
        await asyncio.sleep(0.01)
    return held, queued


def test_releases_of_one_turn_are_one_write_each_handing_over_its_own_grant(
    r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = write_sizes(monkeypatch, RELEASE)
    before = int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "release-burst", limit=4, ttl=10)
        held, queued = await _hold_and_queue(sem, 6)
        assert all(await asyncio.gather(*(lease.release() for lease in held)))
        granted = await asyncio.wait_for(asyncio.gather(*queued[:4]), 5)
        assert len({lease.fence for lease in granted}) == 4
        assert not any(task.done() for task in queued[4:])  # never over the limit
        assert await client.zcard(sem.keys.holders) == 4
        for lease in granted:
            assert await lease.release()
        for lease in await asyncio.wait_for(asyncio.gather(*queued[4:]), 5):
            assert await lease.release()
        await client.aclose()

    asyncio.run(main())
    assert sizes[0] == 4  # the four releases of one turn: one write
    # Each grant went to its waiter in its release's reply, not by message.
    assert int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)) == before


def test_a_release_burst_whose_reply_is_lost_still_hands_over_every_grant(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    """The write of the releases ran but its reply was lost: each release is sent again
    alone and answers as the first did, naming the waiter it granted -- who goes on at
    once, not at its next poll."""

    async def main() -> float:
        client = aioredis.Redis(host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db)
        sem = AsyncRedisSemaphore(client, "release-lost", limit=3, ttl=10)
        try:
            held, queued = await _hold_and_queue(sem, 3)
            fault_proxy.drop_reply(match=RELEASE.sha.encode())
            started = time.monotonic()
            assert all(await asyncio.gather(*(lease.release() for lease in held)))
            granted = await asyncio.wait_for(asyncio.gather(*queued), 5)
            elapsed = time.monotonic() - started
            assert fault_proxy.dropped == 1
            assert len({lease.fence for lease in granted}) == 3
            for lease in granted:
                assert await lease.release()
            return elapsed
        finally:
            await client.aclose()

    assert asyncio.run(main()) < 0.6  # a waiter's poll is a second away (ttl 10 s)
    assert r.zcard("redislock:semaphore:{release-lost}:holders") == 0


def test_a_loop_s_bursts_go_out_on_its_kept_connection(redis_url: str) -> None:
    """Each burst (acquires, then releases) is written on the loop's kept connection,
    as a call alone is: the pool makes no other connection for them."""

    async def main() -> int:
        pool = aioredis.ConnectionPool.from_url(redis_url, max_connections=50)
        client = aioredis.Redis(connection_pool=pool)
        sem = AsyncRedisSemaphore(client, "kept-burst", limit=10, ttl=10)
        await sem.info()  # a call alone: the loop keeps its connection
        for _ in range(5):
            leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(20)))
            held = [lease for lease in leases if lease is not None]
            assert len(held) == 10
            assert all(await asyncio.gather(*(lease.release() for lease in held)))
        made = len(pool._available_connections) + len(pool._in_use_connections)
        await client.aclose()
        await pool.aclose()
        return made

    assert asyncio.run(main()) == 1


def test_at_most_two_writes_of_a_script_await_their_replies(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of 450 attempts goes out 100 at a time, two writes in flight at most:
    the rest waits its turn (another script's call is not queued behind it all)."""
    flying = most = 0
    sizes: list[int] = []
    send = batch._send

    async def counted(script: Any, client: Any, items: list[Any]) -> None:
        nonlocal flying, most
        flying += 1
        most = max(most, flying)
        sizes.append(len(items))
        try:
            await send(script, client, items)
        finally:
            flying -= 1

    monkeypatch.setattr(batch, "_send", counted)

    async def main() -> int:
        client = aioredis.Redis.from_url(redis_url)
        sem = AsyncRedisSemaphore(client, "in-flight", limit=3, ttl=10)
        leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(450)))
        held = [lease for lease in leases if lease is not None]
        for lease in held:
            assert await lease.release()
        await client.aclose()
        return len(held)

    assert asyncio.run(main()) == 3
    assert most == batch.MAX_IN_FLIGHT == 2
    assert sorted(sizes) == [50, 100, 100, 100, 100]  # every attempt sent, once


def test_a_release_cancelled_in_flight_still_hands_its_grant_over_on_its_reply(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    """The releases' write went out, then their callers were cancelled: the reply,
    read all the same, hands each grant to this loop's waiter at once (not after the
    cancelled releases' clean-up sends them again, two more round trips)."""

    async def main() -> float:
        client = aioredis.Redis(host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db)
        sem = AsyncRedisSemaphore(client, "release-cancelled", limit=2, ttl=10)
        try:
            held, queued = await _hold_and_queue(sem, 2)
            fault_proxy.delay = 0.1  # a round trip: 0.2 s
            started = time.monotonic()
            releases = [asyncio.ensure_future(lease.release()) for lease in held]
            await asyncio.sleep(0.05)  # written, not answered
            for task in releases:
                task.cancel()
            granted = await asyncio.wait_for(asyncio.gather(*queued), 5)
            elapsed = time.monotonic() - started
            fault_proxy.delay = 0.0
            assert len({lease.fence for lease in granted}) == 2
            for lease in granted:
                assert await lease.release()
            return elapsed
        finally:
            fault_proxy.delay = 0.0
            await client.aclose()

    # Here 0.6 s through the proxy; 1.8 s when the grants waited for the clean-ups.
    assert asyncio.run(main()) < 1.2
    assert r.zcard("redislock:semaphore:{release-cancelled}:holders") == 0
