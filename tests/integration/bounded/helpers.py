"""Helpers for the bounded-concurrency tests: recorded runs and the interval sweep.

A task body records each run as ``"<start> <end> <label>"`` (``time.time()``) in a
Redis list; :func:`peak` sweeps over the intervals and returns the most runs that
were live at one instant. A permit is taken before the body starts and given back
after it ends, so the true overlap of permits is at least the recorded one: a
recorded peak above the limit is a real violation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery

from celery_redislock import RedisSemaphore, bounded_task, singleton_task
from celery_redislock.core.info import HolderInfo

from ..helpers import wait_until

__all__ = [
    "RECORD",
    "Interval",
    "busy_and_parking_singleton",
    "gated_call",
    "holders",
    "peak",
    "runs",
]

Interval = tuple[float, float, str]

RECORD = """
def record(list_name, label, seconds):
    start = time.time()
    time.sleep(seconds)
    locks.rpush(list_name, f"{start} {time.time()} {label}")
"""
"""Source of ``record(list_name, label, seconds)`` for worker modules (needs ``locks``)."""


def runs(client: redis.Redis, list_name: str) -> list[Interval]:
    """The runs recorded in ``list_name``, by start time."""
    rows = (item.decode().split(" ", 2) for item in client.lrange(list_name, 0, -1))
    return sorted((float(start), float(end), label) for start, end, label in rows)


def peak(intervals: Iterable[tuple[float, float] | Interval]) -> int:
    """Most intervals open at one instant; an end at t closes before a start at t."""
    spans = [(interval[0], interval[1]) for interval in intervals]
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    current = best = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def holders(client: redis.Redis, pool: str) -> list[HolderInfo]:
    """The live permits of ``pool`` (default prefix)."""
    return RedisSemaphore(client, pool, limit=1).info().holders


def busy_and_parking_singleton(
    app: Celery, locks: redis.Redis, worker: Any, **sync_options: Any
) -> tuple[threading.Event, Any, Any]:
    """Pool "api" (limit 1) held by a busy run until the event is set, on a started
    worker (3 processes), and a ``sync(user)`` singleton task in mode
    until_and_while_executing sharing the pool (``sync_options`` added): ``(proceed,
    the busy run's result, sync)``."""
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_standby=0)
    def call() -> str:
        proceed.wait(10)
        return "busy"

    @singleton_task(
        app=app,
        concurrency_limit=1,
        concurrency_key="api",
        concurrency_standby=0,
        singleton_mode="until_and_while_executing",
        **sync_options,
    )
    def sync(user: int) -> int:
        return user

    worker(app, concurrency=3)
    busy = call.delay()
    wait_until(lambda: holders(locks, "api"), what="the busy run")
    return proceed, busy, sync


def gated_call(
    app: Celery, locks: redis.Redis, worker: Any, concurrency: int = 3, **options: Any
) -> tuple[threading.Event, Any, Any]:
    """A ``call(n) -> n`` task of pool "api" (limit 1, ``options`` added) whose run 0
    holds its permit until the event is set, on a started worker of ``concurrency``
    processes, with run 0 holding the permit: ``(proceed, call, run 0's result)``."""
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", **options)
    def call(n: int) -> int:
        if n == 0:
            proceed.wait(10)
        return n

    worker(app, concurrency=concurrency)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="run 0's permit")
    return proceed, call, first
