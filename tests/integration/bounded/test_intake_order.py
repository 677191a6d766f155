"""Intake hands a free permit over to the run it lets go (bounded/intake.py): runs take
permits in the order their intake reached Redis, not in the order their pool
processes get to ``before_start``."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

from celery_redislock import bounded_task
from celery_redislock.celery.signals import permit_acquired, permit_parked

from ..helpers import wait_until
from .helpers import gated_call
from .test_intake import _lot


def test_a_run_let_go_at_intake_is_not_overtaken_by_a_later_one(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    parked, acquired = capture(permit_parked), capture(permit_acquired)
    prerun = capture(task_prerun)
    order: list[int] = []
    slow: set[str] = set()
    overtaken = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        order.append(n)
        return n

    def hold_back(task_id: str = "", **_: Any) -> None:
        # The first run's pool process is slow to reach before_start (a busy
        # machine): the second, sent later, must not take the permit meanwhile.
        if task_id in slow:
            overtaken.wait(1.0)

    task_prerun.connect(hold_back, weak=False)
    try:
        worker(app, concurrency=2)
        first_id = "first-" + str(time.time())
        slow.add(first_id)
        first = call.apply_async((0,), task_id=first_id)
        wait_until(lambda: first_id in {p["task_id"] for p in prerun}, what="the first run")
        second = call.delay(1)
        wait_until(lambda: parked or order, what="the second run parked, or run")
        overtaken.set()
        assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    finally:
        task_prerun.disconnect(hold_back)
    assert order == [0, 1]
    assert [p["task_id"] for p in parked] == [second.id]  # at intake, its permit reserved
    assert [a["task_id"] for a in acquired] == [first.id, second.id]
    info = _lot(app).parking_info()
    assert (info.parked, info.claimed) == (0, 0)


def test_a_released_run_is_not_listed_as_a_child_of_the_run_that_freed_its_permit(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    parked = capture(permit_parked)
    proceed, call, first = gated_call(app, locks, worker)
    second = call.delay(1)
    wait_until(lambda: parked, what="the second run parked")
    proceed.set()
    assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    assert not first.children  # its release published run 1; it did not send it
