"""Child-process bodies for the asyncio tests (importable under spawn)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from celery_redislock import RedisLock
from celery_redislock.asyncio import AsyncRedisLock


def sync_sections(url: str, name: str, duration: float, hold: float, go: Any, out: Any) -> None:
    """Loop acquire -> hold -> release with the sync lock; report (start, end, fence, ok)."""
    client = redis.Redis.from_url(url)
    lock = RedisLock(client, name, ttl=10)
    rows: list[tuple[float, float, int, bool]] = []
    try:
        client.ping()
        go.wait(30)
        stop_at = time.time() + duration
        while time.time() < stop_at:
            lease = lock.acquire(timeout=15)
            if lease is None:
                break
            start = time.time()
            time.sleep(hold)
            end = time.time()
            rows.append((start, end, lease.fence, lease.release()))
    finally:
        out.put(rows)
        client.close()


def async_sections(url: str, name: str, duration: float, hold: float, go: Any, out: Any) -> None:
    """The same loop through ``AsyncRedisLock``, two tasks in one event loop."""
    rows: list[tuple[float, float, int, bool]] = []

    async def task(lock: AsyncRedisLock, stop_at: float) -> None:
        while time.time() < stop_at:
            lease = await lock.acquire(timeout=15)
            if lease is None:
                break
            start = time.time()
            await asyncio.sleep(hold)
            end = time.time()
            rows.append((start, end, lease.fence, await lease.release()))

    async def main() -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await client.ping()
            await asyncio.to_thread(go.wait, 30)
            lock = AsyncRedisLock(client, name, ttl=10)
            stop_at = time.time() + duration
            await asyncio.gather(task(lock, stop_at), task(lock, stop_at))
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        out.put(rows)


def hold_and_die(url: str, name: str, ttl: float, ready: Any) -> None:
    """Acquire through the async lock (renewal off), report the fence, then wait to
    be killed (SIGKILL: no release, no clean-up)."""

    async def main() -> None:
        client = aioredis.Redis.from_url(url)
        lease = await AsyncRedisLock(client, name, ttl=ttl).acquire()
        assert lease is not None
        ready.put(lease.fence)
        await asyncio.sleep(60)

    asyncio.run(main())


def kill(pid: int) -> None:
    """SIGKILL ``pid``."""
    os.kill(pid, signal.SIGKILL)
