"""A run let go at intake while every process of its worker is busy waits in the
worker for a free one: no permit may be reserved for it meanwhile, or the pool's
permit sits idle (up to the reservation's lease) while other workers' runs stay
parked."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun, task_received

from celery_redislock import bounded_task

from ..helpers import wait_until
from .test_intake import _lot


def test_a_run_queued_behind_a_busy_worker_reserves_no_permit(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    received, prerun = capture(task_received), capture(task_prerun)
    gate = threading.Event()

    @app.task
    def busy() -> None:
        gate.wait(20)

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        return n

    worker(app, concurrency=1)
    try:
        blocker = busy.delay()
        wait_until(lambda: any(p["task_id"] == blocker.id for p in prerun), what="busy runs")
        result = call.delay(1)
        wait_until(
            lambda: any(r["request"].id == result.id for r in received),
            what="the bounded run received",
        )
        sem = _lot(app)
        deadline = time.monotonic() + 1.5  # the worker's only thread is busy throughout
        while time.monotonic() < deadline:
            info = sem.parking_info()
            assert info.claimed == 0 and not sem.info().holders, (
                "a permit reserved for a run no process of its worker can start"
            )
            time.sleep(0.05)
    finally:
        gate.set()
    assert result.get(timeout=10) == 1
