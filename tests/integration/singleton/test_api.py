"""What users of celery-singleton and celery-once reach for, with real in-process workers
on a real Redis: lookups, per-call options, loud typos, ``DuplicateTask.ttl_left``, the
terminal outcome of a skipped copy, one log line per event."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import ConfigurationError, DuplicateTask, SingletonTask, singleton_task
from celery_redislock.celery.signals import singleton_duplicate
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import parse_owner

from ..helpers import lock_info, wait_until

# -- singleton_key / singleton_holder -------------------------------------------------


def test_singleton_key_and_holder_follow_the_copy(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, unique_on=["user_id"])
    def job(user_id: int, note: str = "") -> None:
        started.set()
        proceed.wait(10)

    key = job.singleton_key(7, note="x")
    assert key == call_key(job, (7,)) == job.singleton_key(user_id=7)
    assert key != job.singleton_key(8)
    assert job.singleton_holder(7) is None
    result = job.delay(7)
    holder = job.singleton_holder(7, note="other")  # the queued copy
    assert holder is not None and holder.id == result.id
    before = locks.hgetall(f"redislock:lock:{{{key}}}:holders")
    assert job.singleton_holder(7).id == result.id  # type: ignore[union-attr]
    assert locks.hgetall(f"redislock:lock:{{{key}}}:holders") == before  # read-only
    worker(app)
    assert started.wait(10)
    holder = job.singleton_holder(7)  # the running copy
    assert holder is not None and holder.id == result.id
    proceed.set()
    result.get(timeout=10)
    assert job.singleton_holder(7) is None
    with pytest.raises(TypeError):
        job.singleton_key(1, 2, 3)  # the task's own signature is checked


# -- per-call options -------------------------------------------------------------------


def test_per_call_on_duplicate_singleton_and_ttls(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    started = threading.Semaphore(0)
    proceed = threading.Event()
    ttl_seen: list[float] = []

    @app.task(base=SingletonTask)
    def job(n: int) -> int:
        started.release()
        proceed.wait(10)
        return n

    first = job.apply_async((1,), lock_queued_ttl=5)
    assert 4 < lock_info(locks, call_key(job, (1,))).ttl_left <= 5
    assert job.apply_async((1,)).id == first.id  # the task's "existing"
    with pytest.raises(DuplicateTask) as caught:
        job.apply_async((1,), on_duplicate="raise")
    assert caught.value.task_id == first.id
    assert job.s(1).set(on_duplicate="drop").apply_async() is None
    bypass = job.apply_async((1,), singleton=False, lock_ttl=0.7)  # no lock, runs beside
    other = job.apply_async((2,), lock_ttl=0.6)
    worker(app, concurrency=3)
    for _ in range(3):
        assert started.acquire(timeout=10)
    for _ in range(10):  # the running lease of (2,) is renewed at its per-call ttl
        ttl_seen.append(lock_info(locks, call_key(job, (2,))).ttl_left)
        time.sleep(0.1)
    assert 0 < max(ttl_seen) <= 0.6 and lock_info(locks, call_key(job, (2,))).held
    proceed.set()
    assert [r.get(timeout=10) for r in (first, bypass, other)] == [1, 1, 2]
    assert not lock_info(locks, call_key(job, (1,))).held


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lock_tll", 3),
        ("once", {"graceful": True}),
        ("on_duplicat", "raise"),
        ("singleton_mode", "while_running"),
        ("concurrency_limit", 2),
        ("unique_on", ["a"]),
    ],
)
def test_an_unknown_per_call_option_fails_at_the_call(
    app: Celery, locks: redis.Redis, option: str, value: Any
) -> None:
    @app.task(base=SingletonTask)
    def job(a: int) -> None: ...

    with pytest.raises(ConfigurationError, match=option):
        job.apply_async((1,), **{option: value})
    with pytest.raises(ConfigurationError, match=option):
        job.s(1).set(**{option: value}).delay()
    assert locks.keys() == []  # nothing taken, nothing sent under a lock


def test_a_bad_per_call_value_fails_at_the_call(app: Celery) -> None:
    @app.task(base=SingletonTask)
    def job() -> None: ...

    for options in (
        {"on_duplicate": "bogus"},
        {"singleton": "no"},
        {"lock_ttl": -1},
        {"lock_queued_ttl": 0},
    ):
        with pytest.raises(ConfigurationError, match=next(iter(options))):
            job.apply_async(**options)


def test_an_unknown_task_option_fails_at_definition(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="lock_tll"):

        @singleton_task(app=app, lock_tll=5)
        def job() -> None: ...

    @app.task(base=SingletonTask, singleton_mod="interval")
    def other() -> None: ...

    with pytest.raises(ConfigurationError, match="singleton_mod"):
        other.name  # noqa: B018  # @app.task binds (and checks) on first use


# -- DuplicateTask.ttl_left ---------------------------------------------------------------


def test_duplicate_task_carries_the_ttl_left(app: Celery) -> None:
    @app.task(base=SingletonTask, on_duplicate="raise", lock_queued_ttl=60)
    def job() -> None: ...

    first = job.delay()
    time.sleep(0.3)
    with pytest.raises(DuplicateTask) as caught:
        job.delay()
    error = caught.value
    assert error.task_id == first.id and 59 < error.ttl_left <= 59.8  # type: ignore[operator]
    again = pickle.loads(pickle.dumps(error))
    assert (again.task_id, again.key, again.ttl_left) == (error.task_id, error.key, error.ttl_left)


# -- a skipped runtime duplicate ends, one event one log line ------------------------------


def _log_everything(caplog: pytest.LogCaptureFixture) -> None:
    """Ours at DEBUG, and Celery's task lines (the worker set its loggers to ERROR)."""
    caplog.set_level(logging.DEBUG, logger="celery_redislock")
    for name in ("celery.app.trace", "celery.worker.strategy"):
        caplog.set_level(logging.INFO, logger=name)


def test_a_skipped_runtime_duplicate_fails_promptly_with_duplicate_task(
    app: Celery, worker: Any, capture: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started, proceed = threading.Event(), threading.Event()
    duplicates = capture(singleton_duplicate)

    @app.task(base=SingletonTask)
    def job() -> None:
        started.set()
        proceed.wait(10)

    _log_everything(caplog)  # Celery reads its levels when the worker starts ...
    worker(app)
    _log_everything(caplog)  # ... and sets the root logger's
    running = job.delay()
    assert started.wait(10)
    bypass = app.send_task(job.name)  # beat or a foreign producer
    begun = time.monotonic()
    with pytest.raises(DuplicateTask) as caught:
        bypass.get(timeout=10)  # terminal: no hang
    assert time.monotonic() - begun < 5
    assert caught.value.task_id == running.id and caught.value.ttl_left is not None
    assert bypass.state == "FAILURE"
    assert [d["action"] for d in duplicates] == ["skip"]
    proceed.set()
    running.get(timeout=10)
    lines = [r for r in caplog.records if bypass.id in r.getMessage()]
    ours = [r for r in lines if r.name.startswith("celery_redislock")]
    assert [(r.name, r.levelname) for r in ours] == [("celery_redislock.duplicate", "INFO")]
    assert not [r for r in lines if r.getMessage().endswith("ignored")]


def test_a_rescheduled_copy_logs_one_line_per_event(
    app: Celery, worker: Any, capture: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started, proceed = threading.Event(), threading.Event()
    duplicates = capture(singleton_duplicate)

    @app.task(base=SingletonTask, on_running_duplicate="reschedule", reschedule_countdown=0.2)
    def job() -> str:
        started.set()
        proceed.wait(10)
        return "ok"

    _log_everything(caplog)  # Celery reads its levels when the worker starts ...
    worker(app)
    _log_everything(caplog)  # ... and sets the root logger's
    running = job.delay()
    assert started.wait(10)
    bypass = app.send_task(job.name)
    wait_until(lambda: len(duplicates) >= 2, what="two re-schedules")
    proceed.set()
    assert running.get(timeout=10) == "ok"
    assert app.AsyncResult(bypass.id).get(timeout=10) == "ok"
    lines = [r.getMessage() for r in caplog.records if bypass.id in r.getMessage()]
    resent = [m for m in lines if "re-sent" in m]
    assert len(resent) == len(duplicates) >= 2
    assert not [m for m in lines if m.endswith("ignored")]
    assert len([m for m in lines if m.endswith("received")]) == 1  # the first receipt only


def test_a_lost_lease_of_a_task_is_logged_once_at_error(
    app: Celery, locks: redis.Redis, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, lock_ttl=0.5)
    def job() -> None:
        started.set()
        proceed.wait(10)

    _log_everything(caplog)
    worker(app)
    _log_everything(caplog)
    result = job.delay()
    assert started.wait(10)
    locks.delete(f"redislock:lock:{{{call_key(job)}}}:holders")  # as a Redis restart would
    wait_until(lambda: "lost" in caplog.text, what="the loss report")
    time.sleep(0.3)
    proceed.set()
    result.get(timeout=10)
    reports = [r for r in caplog.records if "lost" in r.getMessage() and r.levelno > logging.DEBUG]
    assert [(r.name, r.levelname) for r in reports] == [("celery_redislock.lease", "ERROR")]


# -- singleton_mode="until_and_while_executing" ------------------------------------------


def test_until_and_while_executing_coalesces_a_burst_into_two_runs(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    """One copy queued and one running at most; with "replace" the queued copy carries
    the newest arguments: 100 updates run the body twice, the last with update 99."""
    burst_done = threading.Event()
    runs: list[tuple[float, float, int]] = []

    @app.task(
        base=SingletonTask,
        singleton_mode="until_and_while_executing",
        on_duplicate="replace",
        unique_on=["user_id"],
        reschedule_countdown=0.2,
    )
    def refresh(user_id: int, version: int) -> int:
        start = time.monotonic()
        burst_done.wait(30)  # the first run lasts the whole burst
        time.sleep(0.2)
        runs.append((start, time.monotonic(), version))
        return version

    worker(app, concurrency=3)
    first = refresh.delay(1, 0)
    wait_until(lambda: lock_info(locks, call_key(refresh, (1, 0))).held, what="the first run")
    wait_until(
        lambda: not locks.exists(f"redislock:lock:{{{call_key(refresh, (1, 0))}|queued}}:holders"),
        what="it left the queue",
    )
    for version in range(1, 100):
        refresh.delay(1, version)
        queued = lock_info(locks, refresh.singleton_key(1, 0) + "|queued")
        assert len(queued.holders) == 1  # never two queued
    holder = refresh.singleton_holder(1, 0)  # the running copy first
    assert holder is not None and holder.id == first.id
    last, _ = parse_owner(lock_info(locks, refresh.singleton_key(1, 0) + "|queued").owner)
    burst_done.set()
    assert first.get(timeout=30) == 0
    assert app.AsyncResult(last).get(timeout=30) == 99
    wait_until(lambda: not lock_info(locks, refresh.singleton_key(1, 0)).held, what="the end")
    time.sleep(0.5)  # any stale copy would have run by now
    assert [version for _, _, version in sorted(runs)] == [0, 99]
    ordered = sorted(runs)
    assert all(ordered[i][1] <= ordered[i + 1][0] for i in range(len(ordered) - 1))  # never two


def test_a_republished_bounded_run_logs_one_line_per_event(
    app: Celery, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_redislock import bounded_task

    started, proceed = threading.Event(), threading.Event()

    @bounded_task(
        app=app,
        concurrency_limit=1,
        concurrency_park=False,
        concurrency_countdown=0.2,
        concurrency_jitter=0.0,
        concurrency_wait=0,
    )
    def call_api(n: int) -> int:
        if n == 1:
            started.set()
            proceed.wait(10)
        return n

    _log_everything(caplog)
    worker(app, concurrency=2)
    _log_everything(caplog)
    first = call_api.delay(1)
    assert started.wait(10)
    second = call_api.delay(2)

    def resends() -> int:
        return len(
            [
                r
                for r in caplog.records
                if second.id in r.getMessage() and "re-sent" in r.getMessage()
            ]
        )

    wait_until(lambda: resends() >= 2, what="two re-publishes")
    proceed.set()
    assert (first.get(timeout=10), second.get(timeout=10)) == (1, 2)
    lines = [r for r in caplog.records if second.id in r.getMessage()]
    resent = [r for r in lines if "re-sent" in r.getMessage()]
    assert {(r.name, r.levelname) for r in resent} == {("celery_redislock.permit", "INFO")}
    assert not [r for r in lines if r.getMessage().endswith("ignored")]
    assert len([r for r in lines if r.getMessage().endswith("received")]) == 1
