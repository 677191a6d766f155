"""The child process of the SIGKILL bound test (importable under spawn)."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_redislock.celery.metrics import record


def record_steadily(url: str, name: str, stamps: Any, progress: Any, pause: float) -> None:
    """Count one ``lock`` ``granted`` event of ``name`` every ``pause`` seconds until
    killed. ``stamps[i]``: ``time.monotonic()`` taken just before event ``i`` was
    recorded (one clock for every process of the machine); ``progress``: the events
    recorded so far."""
    client = redis.Redis.from_url(url)
    client.ping()
    for i in range(len(stamps)):
        stamps[i] = time.monotonic()
        record(client, "redislock", "lock", name, "granted")
        progress.value = i + 1
        time.sleep(pause)
