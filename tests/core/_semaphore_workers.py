"""Child-process bodies for the semaphore concurrency tests (importable under spawn)."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_redislock import RedisSemaphore
from celery_redislock.core import semaphore_scripts


def record_intervals(
    url: str, name: str, limit: int, mode: str, rounds: int, hold: float, go: Any, out: Any
) -> None:
    """Acquire ``rounds`` times; report (start, end, inside) per critical section.

    ``mode`` is "fair", "default" (not fair) or "barging" (not fair, no patience).
    ``start``/``end`` are ``time.monotonic()`` (one clock for every process on the
    machine), taken inside the lease; ``inside`` is an unprotected Redis counter of
    the processes in the critical section at that moment.
    """
    if mode == "barging":
        semaphore_scripts.PATIENCE_MS = 1e9
    client = redis.Redis.from_url(url)
    sem = RedisSemaphore(client, name, limit=limit, fair=mode == "fair", ttl=30)
    go.wait(60)  # a Barrier: every process starts its rounds at once
    rows = []
    for _ in range(rounds):
        with sem:
            start = time.monotonic()
            inside = int(client.incr(f"{name}:inside"))
            time.sleep(hold)
            client.decr(f"{name}:inside")
            rows.append((start, time.monotonic(), inside))
    out.put(rows)
    client.close()


def hold_for_ever(url: str, name: str, limit: int, ttl: float, held: Any) -> None:
    """Take a permit, say so, and hang on to it until killed."""
    sem = RedisSemaphore(redis.Redis.from_url(url), name, limit=limit, ttl=ttl)
    assert sem.acquire() is not None
    held.set()
    time.sleep(600)


def wait_for_ever(url: str, name: str, limit: int, fair: bool) -> None:
    """Block on a full semaphore until killed (a waiter that dies while queued)."""
    sem = RedisSemaphore(redis.Redis.from_url(url), name, limit=limit, fair=fair)
    sem.acquire()
    time.sleep(600)
