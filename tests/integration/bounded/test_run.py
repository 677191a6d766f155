"""Bounded concurrency with real in-process workers on a real Redis: permits taken and
given back on every exit, re-scheduling (state, signals, retries), waiting in place,
singleton + limit, limits changed in configuration, eager runs and direct calls."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import ConfigurationError, RedisLockTask, RedisSemaphore, bounded_task
from celery_redislock.celery.bounded.guard import WAIT_HEADER
from celery_redislock.celery.signals import (
    permit_acquired,
    permit_released,
    permit_rescheduled,
    singleton_duplicate,
)
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import parse_owner

from ..conftest import MakeApp
from ..helpers import lock_info, wait_until
from .helpers import gated_call, holders, peak

# Re-scheduled copies come back fast, so the tests do not wait for them long.
# The re-publish mode (concurrency_park=False), with short countdowns.
FAST = {"concurrency_countdown": 0.05, "concurrency_jitter": 0.05, "concurrency_park": False}


def test_permit_signals_and_state_while_rescheduled(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    acquired, released = capture(permit_acquired), capture(permit_released)
    rescheduled = capture(permit_rescheduled)
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_wait=0, **FAST)
    def call(n: int) -> int:
        if n == 0:
            proceed.wait(40)  # set by the test once the second was re-scheduled
        return n

    worker(app, concurrency=3)
    sent = time.monotonic()
    first = call.delay(0)
    wait_until(
        lambda: [r for r in acquired if r["task_id"] == first.id], 30, "the first run's permit"
    )
    since_sent = time.monotonic() - sent  # the most the first run can have waited
    second = call.delay(1)
    wait_until(lambda: len(rescheduled) >= 3, 30, "re-schedules of the second")
    assert second.state == "PENDING"  # queued again, no result stored
    assert [h.owner and parse_owner(h.owner)[0] for h in holders(locks, "api")] == [first.id]
    proceed.set()
    assert first.get(timeout=30) == 0 and second.get(timeout=30) == 1
    assert not holders(locks, "api")

    # Each copy sends its signal after publishing the next, which another worker
    # thread may refuse and report first: the counts, in order, are 1, 2, ... n.
    mine = sorted(
        (r for r in rescheduled if r["task_id"] == second.id), key=lambda r: r["rescheduled"]
    )
    assert [r["rescheduled"] for r in mine] == list(range(1, len(mine) + 1))
    assert all(a["waited"] <= b["waited"] for a, b in itertools.pairwise(mine))
    assert all(
        r["key"] == "api" and r["limit"] == 1 and 0.05 <= r["countdown"] <= 0.1 for r in mine
    )
    got = {r["task_id"]: r for r in acquired}
    assert got[first.id]["rescheduled"] == 0 and 0 <= got[first.id]["waited"] <= since_sent
    assert got[second.id]["rescheduled"] == len(mine)
    assert got[second.id]["waited"] >= mine[-1]["waited"] > 0
    ends = sorted((r["task_id"], r["reason"], r["released"], r["stage"]) for r in released)
    assert ends == sorted([(first.id, "SUCCESS", True, "run"), (second.id, "SUCCESS", True, "run")])


def test_track_started_state_goes_back_to_pending(
    make_app: MakeApp, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    app = make_app(task_track_started=True)
    rescheduled = capture(permit_rescheduled)

    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_key="api",
        concurrency_wait=0,
        concurrency_countdown=1.0,
        concurrency_jitter=0,
        concurrency_park=False,
    )
    def call() -> str:
        return "done"

    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert held is not None
    worker(app)
    result = call.delay()
    wait_until(lambda: rescheduled, what="a re-schedule")
    assert result.state == "PENDING"  # not the STARTED the worker stored first
    held.release()
    assert result.get(timeout=10) == "done"


def test_waits_in_place_and_is_woken_by_the_release(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    acquired, rescheduled = capture(permit_acquired), capture(permit_rescheduled)
    proceed, call, first = gated_call(app, locks, worker, 2, concurrency_wait=10)
    second = call.delay(1)
    wait_until(
        lambda: locks.zcard(RedisSemaphore(locks, "api", limit=1).keys.queue),
        what="the second run waiting in place",
    )
    time.sleep(0.3)
    released_at = time.monotonic()
    proceed.set()
    assert second.get(timeout=10) == 1
    assert time.monotonic() - released_at < 1.0  # woken, not polled
    assert not rescheduled
    waited = next(r["waited"] for r in acquired if r["task_id"] == second.id)
    assert waited >= 0.3
    assert first.get(timeout=10) == 0


def test_only_concurrency_waiters_wait_in_place(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    rescheduled = capture(permit_rescheduled)

    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_key="api",
        concurrency_wait=10,
        concurrency_waiters=1,
        **FAST,
    )
    def call(n: int) -> int:
        return n

    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert held is not None
    worker(app, concurrency=3)
    waiting = call.delay(1)
    queue = RedisSemaphore(locks, "api", limit=1).keys.queue
    wait_until(lambda: locks.zcard(queue) == 1, what="one run waiting in place")
    bounced = call.delay(2)
    wait_until(
        lambda: any(r["task_id"] == bounced.id for r in rescheduled),
        what="the second over the limit re-scheduled",
    )
    assert locks.zcard(queue) == 1
    assert not any(r["task_id"] == waiting.id for r in rescheduled)
    held.release()
    assert waiting.get(timeout=10) == 1 and bounced.get(timeout=10) == 2


def test_a_wait_that_times_out_reschedules(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    rescheduled = capture(permit_rescheduled)

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_wait=0.3, **FAST)
    def call() -> str:
        return "done"

    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert held is not None
    worker(app)
    result = call.delay()
    first = wait_until(lambda: rescheduled, what="a re-schedule")[0]
    assert first["waited"] >= 0.3  # waited in place first
    held.release()
    assert result.get(timeout=10) == "done"


def test_permit_given_back_on_failure_and_retry(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    released = capture(permit_released)

    @bounded_task(
        app=app,
        bind=True,
        concurrency_limit=2,
        concurrency_key="api",
        max_retries=1,
        default_retry_delay=0,
    )
    def call(self: Any, how: str) -> int:
        if how == "fail":
            raise ValueError("boom")
        if how == "retry" and not self.request.retries:
            raise self.retry()
        return int(self.request.retries)

    worker(app)
    failed, retried = call.delay("fail"), call.delay("retry")
    with pytest.raises(ValueError):
        failed.get(timeout=10)
    assert retried.get(timeout=10) == 1
    reasons = sorted((r["task_id"], r["reason"]) for r in released if r["released"])
    assert reasons == sorted(
        [(failed.id, "FAILURE"), (retried.id, "RETRY"), (retried.id, "SUCCESS")]
    )
    assert not holders(locks, "api")


def test_rescheduling_never_spends_retries(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    rescheduled = capture(permit_rescheduled)

    @bounded_task(
        app=app,
        bind=True,
        concurrency_limit=1,
        concurrency_key="api",
        concurrency_wait=0,
        max_retries=1,
        default_retry_delay=0,
        **FAST,
    )
    def call(self: Any) -> tuple[int, bool]:
        if not self.request.retries:
            raise self.retry()  # its one retry
        return int(self.request.retries), WAIT_HEADER in (self.request.headers or {})

    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert held is not None
    worker(app)
    result = call.delay()
    wait_until(lambda: len(rescheduled) >= 5, what="five re-schedules")
    held.release()
    retries, _ = result.get(timeout=10)
    assert retries == 1  # one retry: the re-schedules were not counted


def test_singleton_with_a_limit(app: Celery, locks: redis.Redis, worker: Any, capture: Any) -> None:
    rescheduled, duplicates = capture(permit_rescheduled), capture(singleton_duplicate)
    proceed = threading.Event()

    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_key="api",
        singleton=True,
        concurrency_wait=0,
        **FAST,
    )
    def sync(user: str) -> str:
        if user == "a":
            proceed.wait(10)
        return user

    worker(app, concurrency=3)
    first = sync.delay("a")
    wait_until(lambda: holders(locks, "api"), what="a's permit")
    # A runtime duplicate of a is skipped by the singleton guard, before any permit.
    app.send_task(sync.name, args=("a",))
    wait_until(lambda: duplicates, what="the duplicate skipped")
    assert not rescheduled and len(holders(locks, "api")) == 1
    second = sync.delay("b")
    wait_until(
        lambda: len([r for r in rescheduled if r["task_id"] == second.id]) >= 3,
        what="b re-scheduled",
    )
    # While b bounces, its singleton lock travels with it: still one job per user.
    info = lock_info(locks, call_key(sync, ("b",)))
    assert info.held and parse_owner(info.owner)[0] == second.id
    assert sync.delay("b").id == second.id
    proceed.set()
    assert first.get(timeout=10) == "a" and second.get(timeout=10) == "b"
    assert not lock_info(locks, call_key(sync, ("b",))).held
    assert not holders(locks, "api")


def test_a_limit_changed_in_configuration_spares_running_tasks(
    make_app: MakeApp, locks: redis.Redis, worker: Any
) -> None:
    app = make_app(redislock_concurrency_limits={"api": 3})
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_wait=0, **FAST)
    def call(n: int, hold: bool) -> int:
        start = time.time()
        if hold:
            proceed.wait(10)
        else:
            time.sleep(0.05)
        locks.rpush("runs", f"{start} {time.time()} {n}")
        return n

    worker(app, concurrency=6)
    long = [call.delay(n, True) for n in range(4)]
    wait_until(lambda: len(holders(locks, "api")) == 3, what="three permits (the setting's)")
    time.sleep(0.3)
    assert len(holders(locks, "api")) == 3  # never the 4th: 3 is the limit in force
    app.conf.redislock_concurrency_limits = {"api": 1}
    changed = time.time()
    short = [call.delay(n, False) for n in range(10, 13)]
    time.sleep(0.5)
    assert len(holders(locks, "api")) == 3  # running tasks keep their permits
    proceed.set()
    assert [r.get(timeout=15) for r in long + short] == [0, 1, 2, 3, 10, 11, 12]
    rows = [tuple(float(x) for x in row.split()) for row in locks.lrange("runs", 0, -1)]
    after = [(start, end) for start, end, _ in rows if start > changed]
    assert len(after) == 4  # the 4th long run and the short ones, started after the change
    assert peak(after) == 1  # one at a time under the new limit
    long_ends = [end for start, end, n in rows if n < 10 and start < changed]
    assert all(start >= min(long_ends) for start, _ in after)  # none beside 3 running


def test_eager_runs_wait_for_a_permit(make_app: MakeApp, locks: redis.Redis, capture: Any) -> None:
    app = make_app(task_always_eager=True)
    acquired, released = capture(permit_acquired), capture(permit_released)

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        assert len(holders(locks, "api")) == 1
        return n

    assert call.delay(1).get() == 1
    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert held is not None
    threading.Timer(0.3, held.release).start()
    start = time.monotonic()
    assert call.delay(2).get() == 2  # no queue to go back to: it waited
    assert time.monotonic() - start >= 0.25
    assert [r["waited"] >= 0.25 for r in acquired] == [False, True]
    assert [r["reason"] for r in released] == ["SUCCESS", "SUCCESS"]
    assert not holders(locks, "api")


def test_direct_call_takes_no_permit(app: Celery, locks: redis.Redis, capture: Any) -> None:
    acquired = capture(permit_acquired)

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        return n

    held = RedisSemaphore(locks, "api", limit=1).acquire(blocking=False)
    assert call(5) == 5  # a plain function call: no hook runs, the limit is not checked
    assert not acquired and held is not None and held.release()


def test_per_tenant_pools_from_a_callable_key(app: Celery, locks: redis.Redis, worker: Any) -> None:
    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_key=lambda tenant, n: f"t:{tenant}",
        concurrency_wait=0,
        **FAST,
    )
    def export(tenant: str, n: int) -> None:
        start = time.time()
        time.sleep(0.1)
        locks.rpush(f"runs:{tenant}", f"{start} {time.time()}")

    worker(app, concurrency=6)
    results = [export.delay(tenant, n) for n in range(3) for tenant in ("a", "b")]
    for result in results:
        result.get(timeout=15)
    spans = {
        t: [tuple(float(x) for x in r.split()) for r in locks.lrange(f"runs:{t}", 0, -1)]
        for t in ("a", "b")
    }
    assert peak(spans["a"]) == 1 and peak(spans["b"]) == 1
    assert peak(spans["a"] + spans["b"]) == 2  # two pools, each with its own permit


def test_a_bad_pool_name_fails_the_run(app: Celery, worker: Any) -> None:
    @bounded_task(app=app, concurrency_limit=1, concurrency_key=lambda n: n)
    def call(n: Any) -> None:
        pass

    worker(app)
    with pytest.raises(ConfigurationError, match=r"concurrency_key .* must return a non-empty"):
        call.delay(3).get(timeout=10)


def test_a_bad_limits_setting_fails_the_run(make_app: MakeApp, worker: Any) -> None:
    app = make_app(redislock_concurrency_limits={"api": 0})

    @app.task(base=RedisLockTask, concurrency_limit=1, concurrency_key="api")
    def call() -> None:
        pass

    worker(app)
    message = r"redislock_concurrency_limits\['api'\] must be an int >= 1"
    with pytest.raises(ConfigurationError, match=message):
        call.delay().get(timeout=10)


def test_revoke_terminate_gives_the_permit_back(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", lock_ttl=30)
    def job() -> None:
        locks.set("terminate-started", 1)
        time.sleep(30)

    worker(app, pool="prefork", concurrency=1)
    result = job.delay()
    wait_until(lambda: locks.get("terminate-started"), what="the run to start")
    assert holders(locks, "api")
    result.revoke(terminate=True)
    # Long before lock_ttl (30 s): by the child's postrun and the main process.
    wait_until(lambda: not holders(locks, "api"), timeout=5, what="the permit back")
    wait_until(lambda: result.state == "REVOKED", what="REVOKED")
