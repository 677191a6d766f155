"""A worker main SIGKILLed at each step of a parked run's way, with Celery configured for
redelivery (``acks_late``, prefetch 1, a Redis broker whose ``visibility_timeout`` is
short and ``unacked_restore_interval=1``): the run executes once (#24).

Real ``celery worker`` subprocesses; a killed main's pool processes die with it
(Celery sets their parent-death signal), so the killed run's permit is no longer
renewed and lapses after ``lock_ttl``. Its message, unacknowledged, is handed out
again by the broker to the other worker. Kill points:

* **running**: the parked run, handed a permit by a release, started its body;
  before #24 the redelivered copy found the park token consumed and was skipped as
  "a second message ... that started already": the run was lost;
* **handed a permit**: its message waits in the killed main (the only pool process
  busy), before ``before_start``: the broker's copy or the sweeper's re-publish (the
  reservation lapses) runs it, the other is dropped;
* **standby**: the run, claimed ahead without a permit, waits in place;
* **parked**: the run parked from its pool process, the main killed before the ack.

And the other side: a redelivered copy whose first run is alive (its permit renewed)
is skipped, never run beside it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from celery_redislock.celery.bounded.parking import PARK_HEADER, encode_message, parking_for
from celery_redislock.core.keys import DEFAULT_PREFIX
from celery_redislock.core.parking import new_entry_id

from ..helpers import wait_until
from ..workers import BROKER_DB, AppModule, WorkerProcess, db_url
from .helpers import peak, runs

pytestmark = pytest.mark.slow

CONF = """{
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "broker_transport_options": {
        "visibility_timeout": 4, "unacked_restore_interval": 1, "unacked_restore_throttle": 1
    },
}"""

BODY = """
from celery_redislock import bounded_task
from celery_redislock.celery.signals import permit_duplicate


@permit_duplicate.connect
def count_duplicates(sender=None, task_id=None, **kwargs):
    locks.incr(f"duplicate:{task_id}")


@bounded_task(app=app, concurrency_limit=1, concurrency_key="kill", lock_ttl=2,
              concurrency_standby={standby})
def call(n):
    # The first start of each run sleeps until its worker is killed (or told to end).
    attempt = locks.incr(f"attempt:{n}")
    start = time.time()
    locks.rpush("starts", f"{start} {n} {attempt}")
    while attempt == 1 and not locks.get("end") and time.time() - start < 60:
        time.sleep(0.05)
    locks.rpush("runs", f"{start} {time.time()} {n}")


@app.task(acks_late=False)  # acknowledged at its start: its main takes one more message
def hog(seconds):
    locks.set("hog", "1")
    time.sleep(seconds)
"""


def _module(tmp_path: Path, redis_url: str, standby: int = 0) -> AppModule:
    return AppModule(tmp_path, redis_url, BODY.replace("{standby}", str(standby)), conf=CONF)


def _park(tasks: object, sem: object, n: int) -> tuple[str, str]:
    """Park run ``n`` as park_run does; ``(entry id, task id)``."""
    entry_id, task_id = new_entry_id(), f"run-{n}-{time.time_ns()}"
    options = {"task_id": task_id, "headers": {PARK_HEADER: f"{entry_id} 0 {time.time()}"}}
    payload = encode_message(tasks.call, (n,), {}, options)  # type: ignore[attr-defined]
    sem.park(entry_id, payload, owner=task_id)  # type: ignore[attr-defined]
    return entry_id, task_id


def _kill(worker: WorkerProcess) -> float:
    assert worker.process is not None
    os.kill(worker.process.pid, signal.SIGKILL)  # its pool processes die with it
    worker.process.wait(5)
    return time.time()


def _settled(locks: redis.Redis, broker: redis.Redis, sem: object, queue: str) -> None:
    wait_until(
        lambda: broker.hlen("unacked") == 0 and broker.llen(queue) == 0,
        timeout=20,
        what="every message acknowledged",
    )
    wait_until(lambda: not sem.info().holders, timeout=10, what="no permit left")  # type: ignore[attr-defined]
    info = sem.parking_info()  # type: ignore[attr-defined]
    assert info.parked + info.claimed + info.dead == 0


def test_a_parked_run_killed_while_running_runs_again_from_its_redelivered_message(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(tmp_path, redis_url)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX)
    held = sem.acquire(blocking=False, ttl=60)  # the run before: the only permit
    assert held is not None
    _, task_id = _park(tasks, sem, 1)
    with WorkerProcess(module, concurrency=1, name="a") as a:
        held.release()  # claims run 1 and publishes it: A runs it
        wait_until(lambda: locks.llen("starts") == 1, timeout=20, what="run 1 started")
        killed = _kill(a)
    assert not runs(locks, "runs")
    with WorkerProcess(module, concurrency=1, name="b") as b:
        # B's broker channel restores A's unacknowledged message after visibility_timeout.
        wait_until(lambda: runs(locks, "runs"), timeout=40, what="run 1 from its redelivered copy")
        _settled(locks, broker, sem, module.queue)
        log = b.log()
    ((start, _, label),) = runs(locks, "runs")
    assert label == "1" and start > killed
    assert locks.get(f"duplicate:{task_id}") is None
    assert "second message" not in log and "it runs now" in log


def test_a_redelivered_copy_of_a_live_parked_run_is_skipped(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(tmp_path, redis_url)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX)
    held = sem.acquire(blocking=False, ttl=60)  # outlives a slow worker start
    assert held is not None
    _, task_id = _park(tasks, sem, 1)
    with WorkerProcess(module, concurrency=1, name="a"):
        held.release()
        wait_until(lambda: locks.llen("starts") == 1, timeout=20, what="run 1 started")
        # A second worker's channel restores the running message (visibility_timeout
        # shorter than the run): the copy must not run beside it.
        with WorkerProcess(module, concurrency=1, name="b") as b:
            wait_until(
                lambda: locks.get(f"duplicate:{task_id}"),
                timeout=40,
                what="the redelivered copy skipped",
            )
            log = b.log()
        locks.set("end", "1")
        wait_until(lambda: runs(locks, "runs"), timeout=20, what="run 1 ended")
        _settled(locks, broker, sem, module.queue)
    assert [label for _, _, label in runs(locks, "runs")] == ["1"]
    assert locks.llen("starts") == 1
    assert "is a second message" in log  # a real second delivery: the operator is told


@pytest.mark.parametrize("standby", [0, 1], ids=["handed-a-permit", "standby"])
def test_a_parked_run_killed_before_it_started_runs_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis, standby: int
) -> None:
    module = _module(tmp_path, redis_url, standby)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX, standby=standby)
    held = sem.acquire(blocking=False, ttl=60)  # outlives a slow worker start
    assert held is not None
    locks.set("end", "1")  # no run sleeps here
    with WorkerProcess(module, concurrency=1, name="a") as a:
        if standby:
            _park(tasks, sem, 1)  # claimed ahead, published: its run waits in place
            wait_until(lambda: locks.zcard(sem.keys.queue) == 1, what="the standby waiting")
        else:
            tasks.hog.delay(60)
            wait_until(lambda: locks.get("hog"), what="A's only pool process busy")
            _park(tasks, sem, 1)
            held.release()  # claims run 1 and publishes it: A's main holds it
            wait_until(
                lambda: broker.llen(module.queue) == 0 and broker.hlen("unacked") == 1,
                what="the re-published message in A's main",
            )
        _kill(a)
    with WorkerProcess(module, concurrency=2, name="b"):
        if standby:
            held.release()
        wait_until(lambda: runs(locks, "runs"), timeout=40, what="run 1")
        _settled(locks, broker, sem, module.queue)
        time.sleep(1)
    assert [label for _, _, label in runs(locks, "runs")] == ["1"]


def test_a_run_parked_from_its_pool_process_then_killed_runs_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(tmp_path, redis_url)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX)
    held = sem.acquire(blocking=False, ttl=60)  # outlives a slow worker start
    assert held is not None
    locks.set("end", "1")
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.call.delay(1)  # acks_late: parked at intake or in its pool process
        wait_until(lambda: sem.parking_info().parked == 1, timeout=20, what="run 1 parked")
        _kill(a)  # before or after the ack: either way a copy may come back
    with WorkerProcess(module, concurrency=1, name="b"):
        time.sleep(6)  # visibility_timeout: a copy still unacknowledged comes back
        held.release()
        wait_until(lambda: runs(locks, "runs"), timeout=40, what="run 1")
        _settled(locks, broker, sem, module.queue)
        time.sleep(1)
    assert [label for _, _, label in runs(locks, "runs")] == ["1"]
    assert peak(runs(locks, "runs")) == 1
