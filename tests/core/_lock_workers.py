"""Child-process bodies for the lock concurrency tests (importable under spawn)."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_redislock import RedisLock


def critical_sections(
    url: str, name: str, counter: str, duration: float, hold: float, go: Any, out: Any
) -> None:
    """Loop acquire -> unprotected read-modify-write -> release for ``duration`` s.

    Reports ``(start, end, released_ok)`` per critical section: ``time.time()`` taken
    just inside the lease (one clock for every process of the machine), and whether
    the release found the lease still ours. ``go`` is a barrier that every worker (and
    the test) meets once ready, so that all compete from the same moment.
    """
    client = redis.Redis.from_url(url)
    lock = RedisLock(client, name, ttl=10)
    rows: list[tuple[float, float, bool]] = []
    try:
        client.ping()
        go.wait(30)
        stop_at = time.time() + duration
        while time.time() < stop_at:
            lease = lock.acquire(timeout=15)
            if lease is None:
                break  # starved: shows as a missing or short row list
            start = time.time()
            value = int(client.get(counter) or 0)  # unprotected read-modify-write
            time.sleep(hold)
            client.set(counter, value + 1)
            end = time.time()
            rows.append((start, end, lease.release()))
    finally:
        out.put(rows)
        client.close()
