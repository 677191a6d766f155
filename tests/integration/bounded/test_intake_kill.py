"""A run handed a permit at intake (acknowledged there, its entry claimed with the
permit reserved) whose worker main is SIGKILLed before its pool process takes the
permit in ``before_start``: its message is gone, so the entry is its only copy -- it
is published again when the reservation lapses and runs once; nothing is left.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from celery_redislock.celery.bounded.parking import parking_for
from celery_redislock.core.keys import DEFAULT_PREFIX

from ..helpers import wait_until
from ..workers import BROKER_DB, AppModule, WorkerProcess, db_url
from .helpers import RECORD, runs

pytestmark = pytest.mark.slow

BODY = (
    RECORD
    + """
from celery.signals import task_prerun
from celery_redislock import bounded_task


@task_prerun.connect
def slow_start(task=None, **kwargs):
    # Before before_start: the first worker's pool process is held here until killed.
    if task.name.endswith(".call") and locks.get("slow"):
        locks.set("in-prerun", "1")
        time.sleep(60)


@bounded_task(app=app, concurrency_limit=1, concurrency_key="kill", lock_ttl=2)
def call(n):
    record("runs", str(n), 0)
"""
)


def test_a_run_handed_over_at_intake_outlives_its_killed_worker_and_runs_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = AppModule(tmp_path, redis_url, BODY)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX)
    locks.set("slow", "1")
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.call.delay(1)
        wait_until(lambda: locks.get("in-prerun"), what="the run past intake, before_start")
        # Handed over: acknowledged at intake, its permit reserved, its token not taken.
        assert broker.hlen("unacked") == 0 and broker.llen(module.queue) == 0
        assert sem.parking_info().claimed == 1 and len(sem.info().holders) == 1
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # its pool process dies with it
        a.process.wait(5)
    locks.delete("slow")
    assert not runs(locks, "runs")
    with WorkerProcess(module, concurrency=2, name="b"):
        # The reservation lapses (lock_ttl 2 s): B's sweeper publishes the entry again.
        wait_until(lambda: runs(locks, "runs"), timeout=20, what="the run, published again")
        wait_until(lambda: not sem.info().holders, what="its permit given back")
        info = sem.parking_info()
        assert info.parked + info.claimed + info.dead == 0
        assert [label for _, _, label in runs(locks, "runs")] == ["1"]
