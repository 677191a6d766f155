"""Singleton tasks on real ``celery worker`` processes (prefork): a SIGKILLed child, a
hard time limit, a requeued message after a lost child, and two workers racing."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from celery_redislock.celery.singleton.signature import call_key

from ..helpers import lock_info, wait_until
from ..workers import AppModule, WorkerProcess

pytestmark = pytest.mark.slow

HOLDER = """
@app.task(base=SingletonTask, **{"lock_ttl": 2, **OPTIONS})
def hold(marker, seconds=60):
    locks.rpush(marker, os.getpid())
    time.sleep(seconds)
    return "done"
"""


def _module(tmp_path: Path, redis_url: str, options: str = "{}", conf: str = "{}") -> AppModule:
    return AppModule(tmp_path, redis_url, f"OPTIONS = {options}\n" + HOLDER, conf=conf)


def test_sigkilled_child_frees_the_lock_within_lock_ttl(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(tmp_path, redis_url)  # lock_ttl=2
    with WorkerProcess(module, concurrency=1):
        tasks = module.load()
        result = tasks.hold.delay("killed")
        key = call_key(tasks.hold, ("killed",))
        pid = int(wait_until(lambda: locks.lindex("killed", 0), what="the run to start"))
        assert lock_info(locks, key).held
        os.kill(pid, signal.SIGKILL)
        # Whichever comes first: the main process's release, or the lease's end (the
        # last renewal was before the kill): read on the server, not this test's clock,
        # its time left never exceeds lock_ttl and never grows (no renewal) until freed.
        left: list[float] = []

        def freed() -> bool:
            info = lock_info(locks, key)
            if info.held:
                left.append(info.ttl_left)
            return not info.held

        wait_until(freed, timeout=10, what="the lock freed")
        assert all(ttl <= 2.0 for ttl in left) and left == sorted(left, reverse=True), left
        with pytest.raises(Exception, match=r"Worker exited prematurely|SIGKILL"):
            result.get(timeout=15)
        again = tasks.hold.delay("killed", 0)
        assert again.id != result.id and again.get(timeout=10) == "done"


def test_main_process_releases_the_lock_of_a_killed_child(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(tmp_path, redis_url, options='{"lock_ttl": 60}')
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        tasks.hold.delay("lost")
        key = call_key(tasks.hold, ("lost",))
        pid = int(wait_until(lambda: locks.lindex("lost", 0), what="the run to start"))
        os.kill(pid, signal.SIGKILL)
        # billiard notices a dead child within seconds; the lease would last a minute.
        wait_until(lambda: not lock_info(locks, key).held, timeout=15, what="the release")
        worker.wait_for_log("after worker-lost")


def test_requeued_after_a_lost_child_runs_again(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # acks_late + reject_on_worker_lost: Celery requeues the message and sends no
    # signal, so the dead run's lease is only freed by its TTL. The redelivered copy
    # usually arrives while that lease is still live: it is re-sent once to look again
    # after lock_ttl (a live first run would still hold the lock; this one does not),
    # and must then run -- neither beside a live first run nor lost.
    options = '{"acks_late": True, "reject_on_worker_lost": True, "lock_ttl": 4}'
    module = _module(tmp_path, redis_url, options=options)
    with WorkerProcess(module, concurrency=1):
        tasks = module.load()
        result = tasks.hold.delay("requeued", 1)
        pid = int(wait_until(lambda: locks.lindex("requeued", 0), what="the first run"))
        os.kill(pid, signal.SIGKILL)
        assert result.get(timeout=30) == "done"
        assert locks.llen("requeued") == 2  # ran again, once, after the kill


def test_retry_on_worker_lost_takes_over_the_dead_runs_lock(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # celery 5.7's retry_on_worker_lost re-sends the message from the main process, with
    # the old headers, while the dead run's lease is still live: the re-sent copy must
    # take that lease over rather than find a "duplicate" and never be sent.
    options = '{"retry_on_worker_lost": True, "default_retry_delay": 0}'
    module = _module(tmp_path, redis_url, options=options)
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        result = tasks.hold.delay("retried", 1)
        pid = int(wait_until(lambda: locks.lindex("retried", 0), what="the first run"))
        os.kill(pid, signal.SIGKILL)
        assert result.get(timeout=20) == "done"
        assert locks.llen("retried") == 2
        assert "had lapsed" not in worker.log()  # the lease was handed over, not retaken
        assert not lock_info(locks, call_key(tasks.hold, ("retried", 1))).held


def test_hard_time_limit_releases_from_the_main_process(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    body = """
@app.task(base=SingletonTask, lock_ttl=30, time_limit=1)
def slow(marker):
    locks.rpush(marker, os.getpid())
    time.sleep(60)
"""
    module = AppModule(tmp_path, redis_url, body)
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        result = tasks.slow.delay("limited")
        key = call_key(tasks.slow, ("limited",))
        wait_until(lambda: locks.lindex("limited", 0), what="the run to start")
        assert lock_info(locks, key).held
        with pytest.raises(Exception, match=r"TimeLimitExceeded|Time limit"):
            result.get(timeout=15)
        # Far sooner than lock_ttl (30 s): released by the main process.
        wait_until(lambda: not lock_info(locks, key).held, timeout=5, what="the release")
        worker.wait_for_log("after time-limit")


RACER = """
from celery.signals import task_prerun

@task_prerun.connect
def _seen(sender=None, **kwargs):
    # Every copy a worker starts, run or skipped as a duplicate: proof of the race.
    locks.rpush("seen", sender.request.hostname)

@app.task(base=SingletonTask, lock_ttl=2)
def race(n):
    start = time.time()
    time.sleep(0.15)
    locks.rpush("intervals", f"{start} {time.time()} {os.getpid()}")
"""


def test_two_workers_never_run_one_signature_at_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = AppModule(tmp_path, redis_url, RACER)
    with (
        WorkerProcess(module, concurrency=2, name="a"),
        WorkerProcess(module, concurrency=2, name="b"),
    ):
        tasks = module.load()
        # send_task bypasses apply_async: every copy reaches a worker, which decides.
        sent = []
        for _ in range(40):
            sent.append(tasks.app.send_task(tasks.race.name, args=(7,)))
            time.sleep(0.02)
        time.sleep(0.6)
        wait_until(
            lambda: not lock_info(locks, call_key(tasks.race, (7,))).held,
            what="the last run to end",
        )
    intervals = sorted(
        tuple(float(x) for x in row.split()[:2])
        for row in (item.decode() for item in locks.lrange("intervals", 0, -1))
    )
    seen = {item.decode() for item in locks.lrange("seen", 0, -1)}
    assert len(intervals) >= 3  # it ran, again and again, skipping the overlaps
    assert len(intervals) < len(sent)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two runs overlapped: {intervals}"
    assert len(seen) >= 2, f"both workers must have raced for the lock, saw {seen}"
