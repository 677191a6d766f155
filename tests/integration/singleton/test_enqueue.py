"""Enqueue side of singleton tasks: keys, on_duplicate, countdown/ETA, publish failure,
canvas members, direct calls and eager mode. Real Redis; workers where a run matters."""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

import pytest
import redis
from celery import Celery, chord, group
from celery.result import AsyncResult

from celery_redislock import DuplicateTask, SingletonTask
from celery_redislock.celery.signals import (
    singleton_acquired,
    singleton_duplicate,
    singleton_released,
)
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import parse_owner

from ..conftest import MakeApp
from ..helpers import lock_info, wait_until


def test_enqueue_takes_the_lock_owned_by_the_task_id(
    app: Celery, locks: redis.Redis, capture: Any
) -> None:
    acquired = capture(singleton_acquired)

    @app.task(base=SingletonTask)
    def job(a: int) -> int:
        return a

    result = job.delay(1)
    info = lock_info(locks, call_key(job, (1,)))
    assert info.held
    assert parse_owner(info.owner) == (result.id, False)  # queued
    assert 3590 < info.ttl_left <= 3600  # redislock_queued_ttl's default
    assert [(a["task_id"], a["stage"]) for a in acquired] == [(result.id, "enqueue")]
    name, digest = acquired[0]["key"].rsplit(":", 1)
    assert name == job.name and len(digest) == 32  # no raw arguments in Redis


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (((1,), {}), ((), {"a": 1})),  # f(1) and f(a=1)
        (((1,), {}), ((1, 2), {})),  # f(1) and f(1, b=<its default>)
        (((1,), {"b": 2}), ((), {"b": 2, "a": 1})),  # keyword order
        (((1, (2, 3)), {}), ((1, [2, 3]), {})),  # a tuple arrives as a list
    ],
    ids=["positional-vs-keyword", "default-applied", "keyword-order", "tuple-vs-list"],
)
def test_spellings_of_one_call_are_one_job(app: Celery, first: Any, second: Any) -> None:
    @app.task(base=SingletonTask)
    def job(a: Any, b: Any = 2) -> None:
        pass

    one = job.apply_async(*first)
    two = job.apply_async(*second)
    assert two.id == one.id


def test_different_arguments_are_different_jobs(app: Celery) -> None:
    @app.task(base=SingletonTask)
    def job(a: Any, b: Any = 2) -> None:
        pass

    ids = {job.delay(1).id, job.delay(2).id, job.delay(1, 3).id, job.delay("1").id}
    assert len(ids) == 4


def test_unique_on_picks_the_arguments_that_matter(app: Celery) -> None:
    @app.task(base=SingletonTask, unique_on=["user_id"])
    def refresh(user_id: int, reason: str = "") -> None:
        pass

    first = refresh.delay(5, reason="login")
    assert refresh.delay(5, reason="cron").id == first.id
    assert refresh.delay(6, reason="login").id != first.id


def test_lock_key_gives_full_control(app: Celery, locks: redis.Redis) -> None:
    def key(tenant: str, *args: Any, **kwargs: Any) -> str:
        return f"tenant-sync:{tenant}"

    @app.task(base=SingletonTask, lock_key=key)
    def sync(tenant: str, full: bool = False) -> None:
        pass

    first = sync.delay("acme")
    assert sync.delay("acme", full=True).id == first.id
    assert sync.delay("other").id != first.id
    assert lock_info(locks, "tenant-sync:acme").held


def test_unencodable_argument_is_a_clear_error_before_redis(
    app: Celery, locks: redis.Redis
) -> None:
    @app.task(base=SingletonTask)
    def job(a: Any) -> None:
        pass

    with pytest.raises(ValueError, match=r"argument 'a' of task .* cannot be part of its"):
        job.delay(object())
    with pytest.raises(TypeError):
        job.delay(1, 2, 3)  # does not bind
    assert locks.dbsize() == 0


def test_on_duplicate_existing_returns_the_queued_copy(app: Celery, capture: Any) -> None:
    duplicates = capture(singleton_duplicate)

    @app.task(base=SingletonTask)
    def job() -> None:
        pass

    first = job.delay()
    second = job.delay()
    assert isinstance(second, AsyncResult) and second.id == first.id
    assert [(d["action"], d["existing_id"], d["stage"]) for d in duplicates] == [
        ("existing", first.id, "enqueue")
    ]


def test_on_duplicate_raise_carries_the_existing_id(app: Celery, locks: redis.Redis) -> None:
    @app.task(base=SingletonTask, on_duplicate="raise")
    def job(a: int) -> None:
        pass

    first = job.delay(1)
    with pytest.raises(DuplicateTask) as raised:
        job.delay(1)
    assert raised.value.task_id == first.id
    assert raised.value.key == call_key(job, (1,))
    assert first.id in str(raised.value) and "queued" in str(raised.value)


def test_on_duplicate_drop_logs_signals_and_returns_none(
    app: Celery, capture: Any, caplog: pytest.LogCaptureFixture
) -> None:
    duplicates = capture(singleton_duplicate)

    @app.task(base=SingletonTask, on_duplicate="drop")
    def job() -> None:
        pass

    first = job.delay()
    with caplog.at_level(logging.INFO, logger="celery_redislock"):
        assert job.delay() is None
    assert [d["action"] for d in duplicates] == ["drop"]
    assert f"dropped: {job.name}[{first.id}]" in caplog.text


def test_on_duplicate_replace_revokes_the_queued_copy(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    duplicates = capture(singleton_duplicate)
    ran: list[str] = []

    @app.task(base=SingletonTask, on_duplicate="replace", bind=True)
    def job(self: Any, a: int) -> str:
        ran.append(self.request.id)
        return str(self.request.id)

    worker(app)  # up first: only running workers remember a revoke
    old = job.apply_async((1,), countdown=1)
    new = job.apply_async((1,), countdown=1)
    assert new.id != old.id
    info = lock_info(locks, call_key(job, (1,)))
    assert parse_owner(info.owner) == (new.id, False)
    assert [(d["action"], d["existing_id"]) for d in duplicates] == []  # replaced, not dup
    assert new.get(timeout=10) == new.id
    wait_until(lambda: old.state == "REVOKED", what="the replaced copy revoked")
    assert ran == [new.id]


def test_on_duplicate_replace_never_replaces_a_running_copy(
    app: Celery, worker: Any, capture: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()
    duplicates = capture(singleton_duplicate)

    @app.task(base=SingletonTask, on_duplicate="replace")
    def job() -> str:
        started.set()
        proceed.wait(10)
        return "done"

    worker(app)
    running = job.delay()
    assert started.wait(10)
    again = job.delay()  # behaves as "existing"
    assert again.id == running.id
    assert [d["action"] for d in duplicates] == ["existing"]
    proceed.set()
    assert running.get(timeout=10) == "done"


def test_countdown_and_eta_are_covered_by_the_queued_lease(app: Celery, locks: redis.Redis) -> None:
    @app.task(base=SingletonTask, lock_queued_ttl=10)
    def job(a: int) -> None:
        pass

    job.apply_async((1,), countdown=30)
    assert 39 < lock_info(locks, call_key(job, (1,))).ttl_left <= 40
    eta = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
    job.apply_async((2,), eta=eta)
    assert 69 < lock_info(locks, call_key(job, (2,))).ttl_left <= 70


def test_publish_failure_releases_and_reraises(
    make_app: MakeApp, locks: redis.Redis, capture: Any
) -> None:
    released = capture(singleton_released)
    app = make_app(
        broker_url="redis://127.0.0.1:1/0",
        task_publish_retry=False,
        broker_connection_timeout=0.5,
        broker_connection_retry=False,
    )

    @app.task(base=SingletonTask)
    def job() -> None:
        pass

    with pytest.raises(Exception) as raised:
        job.delay()
    assert not isinstance(raised.value, DuplicateTask)
    assert locks.keys("*:holders") == []
    assert [(r["reason"], r["released"], r["stage"]) for r in released] == [
        ("publish-failed", True, "enqueue")
    ]


def test_group_member_duplicate_raises_instead_of_breaking_the_group(app: Celery) -> None:
    @app.task(base=SingletonTask)
    def job(a: int) -> int:
        return a

    @app.task
    def total(values: list[int]) -> int:
        return sum(values)

    job.delay(1)
    with pytest.raises(DuplicateTask, match="a member of a group cannot be replaced"):
        group(job.s(1), job.s(2)).apply_async()
    job.delay(3)
    with pytest.raises(DuplicateTask, match=r"member of a (group|chord)"):
        chord([job.s(3)], total.s()).apply_async()


def test_direct_call_runs_the_body_without_a_lock(app: Celery, locks: redis.Redis) -> None:
    @app.task(base=SingletonTask)
    def job(a: int) -> int:
        return a * 2

    assert job(2) == 4
    assert locks.dbsize() == 0
    job.delay(3)  # a queued copy holds the lock: a direct call does not look
    assert job(3) == 6


def test_eager_mode_takes_and_releases_the_lock(
    make_app: MakeApp, locks: redis.Redis, capture: Any
) -> None:
    acquired, released = capture(singleton_acquired), capture(singleton_released)
    app = make_app(task_always_eager=True, task_store_eager_result=False)

    @app.task(base=SingletonTask, bind=True)
    def job(self: Any, a: int) -> Any:
        holder = lock_info(locks, call_key(job, (a,)))
        return [parse_owner(holder.owner), self.request.is_eager]

    result = job.delay(1)
    owner, eager = result.get()
    assert eager is True
    assert owner == (result.id, True)  # adopted by the (eager) run
    assert [a["stage"] for a in acquired] == ["enqueue", "run"]
    assert [(r["reason"], r["released"]) for r in released] == [("SUCCESS", True)]
    assert locks.keys("*:holders") == []


def test_eager_retry_runs_again_and_leaves_no_lock(make_app: MakeApp, locks: redis.Redis) -> None:
    app = make_app(task_always_eager=True)

    @app.task(base=SingletonTask, bind=True, max_retries=2)
    def job(self: Any) -> int:
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return int(self.request.retries)

    assert job.delay().get() == 2
    assert locks.keys("*:holders") == []


def test_eager_duplicate_of_a_queued_copy_is_existing(make_app: MakeApp) -> None:
    producer = make_app()
    eager = make_app(task_always_eager=True)

    @producer.task(base=SingletonTask, name="shared.job")
    def queued() -> str:
        return "queued"

    @eager.task(base=SingletonTask, name="shared.job")
    def inline() -> str:
        return "inline"

    first = queued.delay()
    assert inline.delay().id == first.id  # the lock is shared through Redis


def test_apply_without_headers_takes_the_lock_at_run_time(app: Celery, locks: redis.Redis) -> None:
    @app.task(base=SingletonTask)
    def job(a: int) -> int:
        return int(lock_info(locks, call_key(job, (a,))).held)

    assert job.apply((1,)).get() == 1
    assert locks.keys("*:holders") == []
    queued = job.delay(2)
    skipped = job.apply((2,))  # a runtime duplicate of the queued copy: skipped
    assert skipped.state == "IGNORED" and queued.state == "PENDING"
