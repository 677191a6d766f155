"""A burst of calls whose connections fail: the calls are sent again without emptying
the pool (hundreds of calls taking a connection each at once emptied it:
MaxConnectionsError; asyncio/calls.py bounds the calls in flight), and each call is
answered once, as its first execution answered (no second lease, no lost release)."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from celery_redislock.asyncio import AsyncRedisSemaphore
from celery_redislock.core.semaphore_scripts import ACQUIRE, RELEASE
from tests.faults import FaultProxy


def test_a_burst_whose_replies_are_lost_is_sent_again_together(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    async def main() -> None:
        # A pool of 100 connections (redis-py's default): a burst re-sent call by call
        # takes 200 at once.
        client = aioredis.Redis(host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db)
        sem = AsyncRedisSemaphore(client, "burst-reset", limit=500, ttl=30)
        try:
            await (await sem.acquire(blocking=False)).release()  # type: ignore[union-attr]
            # Both writes in flight are lost with their connections (held at the proxy,
            # then reset); the re-sent ones pass.
            fault_proxy.hold(ACQUIRE.sha.encode())
            calls = [asyncio.ensure_future(sem.acquire(blocking=False)) for _ in range(450)]
            assert await asyncio.to_thread(fault_proxy.wait_held, 2)
            fault_proxy.cut()  # and the hold ended at once: re-sent only once seen reset
            fault_proxy.release_held()
            got = await asyncio.gather(*calls, return_exceptions=True)
            assert [g for g in got if not hasattr(g, "fence")] == []  # each granted, no error
            assert len({lease.fence for lease in got}) == 450  # type: ignore[union-attr]
            assert r.zcard("redislock:semaphore:{burst-reset}:holders") == 450
            # A release burst whose replies are lost after it ran: each answered once.
            fault_proxy.drop_reply(RELEASE.sha.encode(), times=1)
            released = await asyncio.gather(
                *(lease.release() for lease in got),  # type: ignore[union-attr]
                return_exceptions=True,
            )
            assert fault_proxy.dropped == 1
            assert released == [True] * 450
            assert r.zcard("redislock:semaphore:{burst-reset}:holders") == 0
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_burst_stalled_past_the_socket_timeout_is_sent_again_together(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    async def main() -> None:
        client = aioredis.Redis(
            host="127.0.0.1", port=fault_proxy.port, db=fault_proxy.db, socket_timeout=0.5
        )
        sem = AsyncRedisSemaphore(client, "burst-stall", limit=500, ttl=30)
        try:
            await (await sem.acquire(blocking=False)).release()  # type: ignore[union-attr]
            fault_proxy.pause()  # longer than the socket timeout, shorter than two
            asyncio.get_running_loop().call_later(0.75, fault_proxy.resume)
            got = await asyncio.gather(
                *(sem.acquire(blocking=False) for _ in range(450)), return_exceptions=True
            )
            assert [g for g in got if not hasattr(g, "fence")] == []  # each granted, no error
            assert r.zcard("redislock:semaphore:{burst-stall}:holders") == 450
            assert all(await asyncio.gather(*(lease.release() for lease in got)))  # type: ignore[union-attr]
        finally:
            fault_proxy.resume()
            await client.aclose()

    asyncio.run(main())
