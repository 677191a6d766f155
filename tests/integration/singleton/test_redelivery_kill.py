"""A singleton run whose worker main is SIGKILLed mid-body, with Celery configured for
redelivery (``acks_late``, prefetch 1, a short ``visibility_timeout``): the broker's
copy runs once, after the dead run's lock lapsed unrenewed -- and a copy whose first
run is alive (its lock renewed) never runs beside it (#24).

Real ``celery worker`` subprocesses; the killed main's pool processes die with it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from ..helpers import wait_until
from ..workers import AppModule, WorkerProcess

pytestmark = pytest.mark.slow

CONF = """{
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "broker_transport_options": {
        "visibility_timeout": 4, "unacked_restore_interval": 1, "unacked_restore_throttle": 1
    },
}"""

BODY = """
@singleton_task(app=app, lock_ttl=2)
def sync(n):
    # The first start sleeps until its worker is killed (or told to end).
    attempt = locks.incr(f"attempt:{n}")
    start = time.time()
    locks.rpush("starts", f"{start} {attempt}")
    while attempt == 1 and not locks.get("end") and time.time() - start < 60:
        time.sleep(0.05)
    locks.rpush("runs", f"{start} {time.time()} {attempt}")
"""


def _runs(locks: redis.Redis) -> list[tuple[float, float, int]]:
    rows = (item.decode().split() for item in locks.lrange("runs", 0, -1))
    return sorted((float(s), float(e), int(a)) for s, e, a in rows)


def test_a_singleton_run_killed_with_its_main_runs_again_from_its_redelivered_message(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = AppModule(tmp_path, redis_url, BODY, conf=CONF)
    tasks = module.load()
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.sync.delay(1)
        wait_until(lambda: locks.llen("starts") == 1, timeout=20, what="the first run")
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # its pool process dies with it
        a.process.wait(5)
        killed = time.time()
    with WorkerProcess(module, concurrency=1, name="b"):
        wait_until(lambda: _runs(locks), timeout=60, what="the run, from its redelivered copy")
        time.sleep(2)
    ((start, _, attempt),) = _runs(locks)
    assert attempt == 2 and start > killed


def test_a_redelivered_copy_of_a_live_singleton_run_never_runs_beside_it(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = AppModule(tmp_path, redis_url, BODY, conf=CONF)
    tasks = module.load()
    with WorkerProcess(module, concurrency=1, name="a"):
        tasks.sync.delay(1)
        wait_until(lambda: locks.llen("starts") == 1, timeout=20, what="the first run")
        with WorkerProcess(module, concurrency=1, name="b") as b:
            # B's channel restores the running message (visibility_timeout shorter
            # than the run): its copy looks again once the lease would have lapsed,
            # finds it renewed and is skipped. Wait for the skip itself: the re-send
            # line before it says "skipped then if ...", and B leaving with the re-sent
            # copy still due hands it to A, which runs it once the first run ended --
            # Celery's own at-least-once for a visibility_timeout shorter than the run.
            wait_until(lambda: "] skipped: " in b.log(), timeout=40, what="the copy skipped")
        locks.set("end", "1")
        wait_until(lambda: _runs(locks), timeout=20, what="the first run ended")
    assert [attempt for _, _, attempt in _runs(locks)] == [1]
    assert locks.llen("starts") == 1


def test_a_killed_run_with_a_longer_per_call_lock_ttl_runs_again_from_its_redelivered_message(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # apply_async(lock_ttl=20): the dead run's lock lasts up to 20 s, the task's
    # lock_ttl is 2. The redelivered copy must run once that lock lapsed unrenewed --
    # one look after the task's 2 s found it still there and skipped the copy as a
    # live run's duplicate: the run was lost. Looks spaced by at most lock_ttl (a
    # countdown beyond visibility_timeout would be delivered again by the broker).
    module = AppModule(tmp_path, redis_url, BODY, conf=CONF)
    tasks = module.load()
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.sync.apply_async((1,), lock_ttl=20)
        wait_until(lambda: locks.llen("starts") == 1, timeout=20, what="the first run")
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # its pool process dies with it
        a.process.wait(5)
        killed = time.time()
    with WorkerProcess(module, concurrency=1, name="b") as b:
        wait_until(lambda: _runs(locks), timeout=60, what="the run, from its redelivered copy")
        time.sleep(3)
        log = b.log()
    ((start, _, attempt),) = _runs(locks)
    assert attempt == 2 and start > killed
    assert "] skipped: " not in log  # never taken for a live run's duplicate
