"""A run published again -- by the release that claimed it from the parking queue,
re-scheduled by the refused run itself, or a singleton duplicate re-sent by its run --
leaves no subscription to its result channel in the publishing process, and is no
child of the run that published it.

Celery's Redis result backend subscribes to a task's result channel when the task is
sent (``on_task_call``), unless joins block in that process (``task_join_will_block``:
prefork and solo pools), and unsubscribes when the ``AsyncResult`` is collected. In a
pool whose joins do not block (gevent, eventlet), an ``AsyncResult`` kept as a child of
the run (``add_to_parent``) kept its subscription, one more per re-scheduled run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import task_postrun

from celery_redislock import SingletonTask, bounded_task
from celery_redislock.celery.signals import permit_rescheduled, singleton_duplicate

from ..helpers import wait_until
from ..workers import RESULTS_DB, AppModule, WorkerProcess, db_url


def test_a_rescheduled_copy_is_no_child_of_the_refused_run(
    app: Celery, worker: Any, capture: Any
) -> None:
    rescheduled = capture(permit_rescheduled)
    children: list[list[str]] = []
    proceed = threading.Event()

    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_key="api",
        concurrency_wait=0,
        concurrency_park=False,
        concurrency_countdown=0.05,
        concurrency_jitter=0.05,
    )
    def call(n: int) -> int:
        if n == 0:
            proceed.wait(20)
        return n

    def on_postrun(sender: Any = None, task: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "name", None) == call.name:
            children.append([str(child.id) for child in task.request.children or ()])

    task_postrun.connect(on_postrun, weak=False)
    try:
        worker(app, concurrency=2)
        first = call.delay(0)
        second = call.delay(1)
        wait_until(lambda: rescheduled, 20, "a re-schedule of the second")
        proceed.set()
        assert first.get(timeout=20) == 0 and second.get(timeout=20) == 1
    finally:
        task_postrun.disconnect(on_postrun)
    assert len(children) >= 3  # both runs and at least one refused copy
    assert children == [[]] * len(children)  # before: the refused run listed its copy


def test_a_duplicate_resent_by_its_run_is_no_child_of_it(
    app: Celery, worker: Any, capture: Any
) -> None:
    duplicates = capture(singleton_duplicate)
    children: list[list[str]] = []
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, on_running_duplicate="reschedule", reschedule_countdown=0.1)
    def job() -> str:
        started.set()
        proceed.wait(20)
        return "ok"

    def on_postrun(sender: Any = None, task: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "name", None) == job.name:
            children.append([str(child.id) for child in task.request.children or ()])

    task_postrun.connect(on_postrun, weak=False)
    try:
        worker(app)
        running = job.delay()
        assert started.wait(20)
        bypass = app.send_task(job.name)  # no enqueue lock: a duplicate at run time
        wait_until(lambda: duplicates, 20, "a re-send of the duplicate")
        proceed.set()
        assert running.get(timeout=20) == "ok"
        assert app.AsyncResult(bypass.id).get(timeout=20) == "ok"
    finally:
        task_postrun.disconnect(on_postrun)
    assert len(children) >= 3
    assert children == [[]] * len(children)  # before: the duplicate listed its copy


BODY = """
from celery._state import _set_task_join_will_block
from celery.signals import worker_process_init
from celery_redislock import bounded_task


@worker_process_init.connect
def joins_do_not_block(**kwargs):
    _set_task_join_will_block(False)  # as in a gevent or eventlet pool


@bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_standby=0,
              concurrency_park={park}, concurrency_countdown=0.1, concurrency_jitter=0.1)
def call(n):
    time.sleep(0.2)
    return n
"""


@pytest.mark.slow
@pytest.mark.parametrize("park", [True, False], ids=["parked", "rescheduled"])
def test_no_result_subscription_is_left_by_a_publish(
    tmp_path: Path, redis_url: str, park: bool
) -> None:
    module = AppModule(tmp_path, redis_url, BODY.format(park=park))
    results = redis.Redis.from_url(db_url(redis_url, RESULTS_DB))
    with WorkerProcess(module, concurrency=3) as worker:
        tasks = module.load()
        ids = [tasks.call.delay(n).id for n in range(6)]  # no AsyncResult kept here

        def done() -> bool:
            rows = [results.get(f"celery-task-meta-{task_id}") for task_id in ids]
            return all(row and json.loads(row)["status"] == "SUCCESS" for row in rows)

        wait_until(done, 60, "the six runs")
        log = worker.log()
        assert log.count("released from the parked queue" if park else "re-sent to run")
        assert not tasks.app.backend.result_consumer.subscribed_to  # none by this process
        channels = [f"celery-task-meta-{task_id}" for task_id in ids]
        # Before: the re-scheduled copies' channels kept subscribers in the worker.
        assert [count for _, count in results.pubsub_numsub(*channels)] == [0] * 6
    results.close()
