"""Bounded concurrency on real ``celery worker`` processes: two prefork workers of
concurrency 4 each on the private Redis broker. Every run records its start and end
in Redis; an interval sweep over them gives the peak concurrency, which must equal
the limit under load and never exceed it."""

from __future__ import annotations

import os
import signal
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis

from celery_redislock.celery.singleton.signature import call_key

from ..helpers import lock_info, wait_until
from ..workers import AppModule, WorkerProcess, side_by_side
from .helpers import RECORD, holders, peak, runs

pytestmark = [pytest.mark.slow, pytest.mark.serial]

HEADER = (
    """
from celery_redislock import bounded_task
from celery_redislock.celery.signals import permit_rescheduled


@permit_rescheduled.connect
def count_reschedules(sender=None, task_id=None, **kwargs):
    locks.incr(f"rescheduled:{task_id}")
"""
    + RECORD
)


def _module(tmp_path: Path, redis_url: str, body: str, conf: str = "{}") -> AppModule:
    return AppModule(tmp_path, redis_url, HEADER + body, conf=conf)


def _two_workers(module: AppModule) -> AbstractContextManager[object]:
    """Workers a and b (prefork, 4 processes each), started and stopped side by side."""
    return side_by_side(
        WorkerProcess(module, concurrency=4, name="a"),
        WorkerProcess(module, concurrency=4, name="b"),
    )


def test_limit_is_reached_under_load_and_never_exceeded(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, bind=True, concurrency_limit=3, lock_ttl=5)
def call(self, n):
    record("runs", self.request.hostname, 0.2)
    return n
""",
    )
    with _two_workers(module):
        tasks = module.load()
        results = [tasks.call.delay(n) for n in range(30)]
        assert [r.get(timeout=60) for r in results] == list(range(30))
    done = runs(locks, "runs")
    assert len(done) == 30
    assert peak(done) == 3  # reached, and never more
    assert len({label for _, _, label in done}) == 2  # both workers ran some
    assert not holders(locks, tasks.call.name)


def test_a_pool_shared_by_two_task_types(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=3, concurrency_key="stripe-api")
def charge(n):
    record("runs", "charge", 0.15)


@bounded_task(app=app, concurrency_limit=3, concurrency_key="stripe-api")
def refund(n):
    record("runs", "refund", 0.15)
""",
    )
    with _two_workers(module):
        tasks = module.load()
        results = [task.delay(n) for n in range(12) for task in (tasks.charge, tasks.refund)]
        for result in results:
            result.get(timeout=60)
    done = runs(locks, "runs")
    assert len(done) == 24 and peak(done) == 3
    by_type = {kind: [r for r in done if r[2] == kind] for kind in ("charge", "refund")}
    # Both kinds ran beside each other at some point, within the one limit.
    assert any(c[0] < r[1] and r[0] < c[1] for c in by_type["charge"] for r in by_type["refund"])
    assert not holders(locks, "stripe-api")


def test_max_retries_1_under_a_busy_limit_still_completes(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
def busy(seconds):
    record("runs", "busy", seconds)


@bounded_task(app=app, bind=True, concurrency_limit=1, concurrency_key="api", max_retries=1,
              default_retry_delay=0, concurrency_wait=0, concurrency_countdown=0.1,
              concurrency_park=False,
              concurrency_jitter=0.1)
def flaky(self):
    locks.rpush("attempts", self.request.retries)
    if not self.request.retries:
        raise self.retry()  # its one retry: re-schedules must not have spent it
    return "done"
""",
    )
    with _two_workers(module):
        tasks = module.load()
        busy = tasks.busy.delay(2.0)
        wait_until(lambda: holders(locks, "api"), what="the busy run")
        result = tasks.flaky.delay()
        assert result.get(timeout=30) == "done"
        busy.get(timeout=10)
    assert [int(x) for x in locks.lrange("attempts", 0, -1)] == [0, 1]
    assert int(locks.get(f"rescheduled:{result.id}") or 0) >= 5


def test_sigkilled_child_gives_its_permit_back(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, bind=True, concurrency_limit=3, concurrency_key="api", lock_ttl=2)
def call(self, n):
    locks.rpush("started", f"{os.getpid()} {self.request.id}")
    record("runs", str(n), 1.0)
    return n
""",
    )
    with _two_workers(module):
        tasks = module.load()
        results = [tasks.call.delay(n) for n in range(12)]
        row = wait_until(lambda: locks.lindex("started", 0), what="a run").decode()
        pid, task_id = row.split()
        assert task_id in [h.owner.split("@")[0] for h in holders(locks, "api") if h.owner]
        os.kill(int(pid), signal.SIGKILL)
        # Within one lock_ttl at most, read on the server (not this test's clock): the
        # permit's time left never exceeds 2 s and never grows (no renewal) until freed.
        left: list[float] = []

        def freed() -> bool:
            mine = [
                h.ttl_left
                for h in holders(locks, "api")
                if h.owner and h.owner.split("@")[0] == task_id
            ]
            left.extend(mine)
            return not mine

        wait_until(freed, timeout=10, what="the killed run's permit back")
        assert all(ttl <= 2.0 for ttl in left) and left == sorted(left, reverse=True), left
        outcomes = []
        for result in results:
            try:
                outcomes.append(result.get(timeout=30))
            except Exception as exc:
                outcomes.append(type(exc).__name__)
    assert outcomes.count("WorkerLostError") == 1
    assert sorted(o for o in outcomes if isinstance(o, int)) == [
        n for n, r in enumerate(results) if r.id != task_id
    ]
    done = runs(locks, "runs")
    assert len(done) == 11 and peak(done) <= 3
    assert not holders(locks, "api")


def test_main_process_gives_permits_back_after_a_kill_or_a_hard_time_limit(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # lock_ttl=30: a permit back within seconds was given back by the worker's main
    # process, which Celery tells (task_failure) that the child died or was killed.
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=1, concurrency_key="api", lock_ttl=30, time_limit=2)
def slow(marker):
    locks.rpush(marker, os.getpid())
    time.sleep(60)
""",
    )
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        killed = tasks.slow.apply_async(("killed",), time_limit=60)
        pid = int(wait_until(lambda: locks.lindex("killed", 0), what="the first run"))
        assert holders(locks, "api")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception, match=r"Worker exited prematurely|SIGKILL"):
            killed.get(timeout=15)
        wait_until(lambda: not holders(locks, "api"), timeout=5, what="the permit back")
        worker.wait_for_log("released the permit of pool 'api' held by")
        worker.wait_for_log("after worker-lost")

        limited = tasks.slow.delay("limited")
        wait_until(lambda: locks.lindex("limited", 0), what="the second run")
        assert holders(locks, "api")
        with pytest.raises(Exception, match=r"TimeLimitExceeded|Time limit"):
            limited.get(timeout=15)
        wait_until(lambda: not holders(locks, "api"), timeout=5, what="the permit back")
        worker.wait_for_log("after time-limit")


def test_per_tenant_pools_from_a_callable_key(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=2, concurrency_key=lambda tenant, n: f"tenant:{tenant}")
def export(tenant, n):
    record("runs", tenant, 0.2)
""",
    )
    with _two_workers(module):
        tasks = module.load()
        results = [tasks.export.delay(t, n) for n in range(6) for t in ("x", "y", "z")]
        for result in results:
            result.get(timeout=60)
    done = runs(locks, "runs")
    assert len(done) == 18
    for tenant in ("x", "y", "z"):
        assert peak(r for r in done if r[2] == tenant) == 2  # each tenant's own limit
    assert peak(done) > 2  # tenants do not share one pool


def test_singleton_with_a_limit(tmp_path: Path, redis_url: str, locks: redis.Redis) -> None:
    # One run per user at a time, and at most 2 runs at once overall.
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=2, concurrency_key="sync", singleton=True,
              unique_on=["user"], lock_ttl=5)
def sync(user, attempt=0):
    record("runs", user, 0.25)
    return user
""",
    )
    with _two_workers(module):
        tasks = module.load()
        users = [f"u{i}" for i in range(6)]
        results = {user: tasks.sync.delay(user) for user in users}
        # Enqueued again while queued, bouncing or running: the same job comes back.
        assert all(tasks.sync.delay(user, 1).id == results[user].id for user in users)
        # Runtime duplicates (send_task bypasses the enqueue lock): skipped or run
        # after the first, never beside it.
        for user in users:
            tasks.app.send_task(tasks.sync.name, args=(user,))
        assert {user: r.get(timeout=60) for user, r in results.items()} == {
            user: user for user in users
        }
        time.sleep(1.0)  # let the duplicates finish or be skipped
        wait_until(lambda: not holders(locks, "sync"), what="every permit back")
    done = runs(locks, "runs")
    assert peak(done) == 2
    for user in users:
        assert len([r for r in done if r[2] == user]) >= 1
        assert peak(r for r in done if r[2] == user) == 1
        assert not lock_info(locks, call_key(tasks.sync, (user,))).held


def test_a_limit_changed_in_configuration_spares_running_tasks(
    tmp_path: Path, redis_url: str, locks: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rolling deploy: worker a (limit 3) runs three long tasks; worker b starts with
    # limit 1 and a is shut down warmly. a's tasks finish (nothing is revoked); b
    # starts nothing until fewer than 1 run, then one at a time.
    conf = '{"redislock_concurrency_limits": {"api": int(os.environ["API_LIMIT"])}}'
    module = _module(
        tmp_path,
        redis_url,
        """
@bounded_task(app=app, concurrency_limit=3, concurrency_key="api", concurrency_wait=0,
              concurrency_countdown=0.1, concurrency_jitter=0.1)
def call(n, seconds):
    record("runs", str(n), seconds)
    return n
""",
        conf=conf,
    )
    monkeypatch.setenv("API_LIMIT", "3")
    a = WorkerProcess(module, concurrency=4, name="a").start()
    try:
        tasks = module.load()
        long = [tasks.call.delay(n, 2.0) for n in range(3)]
        wait_until(lambda: len(holders(locks, "api")) == 3, what="three long runs")
        monkeypatch.setenv("API_LIMIT", "1")
        with WorkerProcess(module, concurrency=4, name="b"):
            assert a.process is not None
            a.process.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish
            a.wait_for_log("Warm shutdown")  # a takes no new message from here on
            changed = time.time()
            short = [tasks.call.delay(n, 0.2) for n in range(10, 14)]
            assert [r.get(timeout=30) for r in long + short] == [0, 1, 2, 10, 11, 12, 13]
            a.process.wait(15)
    finally:
        a.stop()
    done = runs(locks, "runs")
    long_runs = [r for r in done if int(r[2]) < 10]
    short_runs = [r for r in done if int(r[2]) >= 10]
    assert all(start < changed for start, _, _ in long_runs)
    assert all(start >= max(end for _, end, _ in long_runs) for start, _, _ in short_runs)
    assert peak(short_runs) == 1
