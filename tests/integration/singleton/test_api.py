"""What users of celery-singleton and celery-once reach for, with real in-process workers
on a real Redis: lookups, per-call options, loud typos, ``DuplicateTask.ttl_left``, the
terminal outcome of a skipped copy, one log line per event."""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import ConfigurationError, DuplicateTask, SingletonTask, singleton_task
from celery_redislock.celery.singleton.signature import call_key

from ..helpers import lock_info

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
    [("lock_tll", 3), ("once", {"graceful": True}), ("on_duplicat", "raise"),
     ("singleton_mode", "while_running"), ("concurrency_limit", 2), ("unique_on", ["a"])],
)  # fmt: skip
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

    for options in ({"on_duplicate": "bogus"}, {"singleton": "no"}, {"lock_ttl": -1},
                    {"lock_queued_ttl": 0}):  # fmt: skip
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
