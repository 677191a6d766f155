"""Child-process bodies for the rate limiter's process tests (importable under spawn)."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_redislock import RedisRateLimiter


def hammer(
    url: str,
    name: str,
    rate: Any,
    seconds: float,
    shift: float,
    go: Any,
    out: Any,
    slots: int = 1000,
) -> None:
    """Acquire ``name`` as fast as admitted for ``seconds``; report each admission's
    server time (``last_admission.at``). ``shift``: this process's wall clock
    (``time.time``) is moved by that many seconds first -- the limiter must not care."""
    if shift:
        wall = time.time
        time.time = lambda: wall() + shift  # type: ignore[assignment]
    client = redis.Redis.from_url(url)
    limiter = RedisRateLimiter(client, name, rate=rate, slots=slots)
    limiter.retry_after()  # connected before the start
    go.wait(30)
    end = time.monotonic() + seconds
    times = []
    while True:
        left = end - time.monotonic()
        if left <= 0 or not limiter.acquire(timeout=left):
            break
        admission = limiter.last_admission
        assert admission is not None
        times.append(admission.at)
    out.put(times)
    client.close()
