"""Worker side of singleton tasks, with real in-process workers on a real Redis:
adoption, renewal, runtime duplicates, retry, release on every exit, revoke, modes,
lost leases and configuration."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery, Task
from celery.signals import before_task_publish

from celery_redislock import RedisLock, SingletonTask
from celery_redislock.celery.signals import (
    lease_lost,
    singleton_acquired,
    singleton_duplicate,
    singleton_released,
)
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import KEY_HEADER, TOKEN_HEADER, parse_owner
from celery_redislock.errors import DuplicateTask, RedisRestarting
from celery_redislock.testing import RedisServer

from ..conftest import MakeApp
from ..helpers import lock_info, wait_until
from ..workers import BROKER_DB, LOCKS_DB, RESULTS_DB, db_url


def test_run_adopts_the_lock_and_renews_a_short_lease(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, lock_ttl=0.6)
    def job() -> str:
        started.set()
        proceed.wait(10)
        return "done"

    key = call_key(job)
    result = job.delay()
    queued_ttl = lock_info(locks, key).ttl_left
    worker(app)
    assert started.wait(10)
    seen = []
    for _ in range(15):  # 1.5 s: well past the lease time, renewed all along
        info = lock_info(locks, key)
        seen.append((info.held, parse_owner(info.owner), info.ttl_left <= 0.6))
        time.sleep(0.1)
    assert queued_ttl > 3000
    assert set(seen) == {(True, (result.id, True), True)}
    assert job.delay().id == result.id  # a duplicate of the running copy: "existing"
    proceed.set()
    assert result.get(timeout=10) == "done"


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_released_before_the_result_is_stored(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any, outcome: str
) -> None:
    released = capture(singleton_released)

    @app.task(base=SingletonTask)
    def job(fail: bool) -> str:
        if fail:
            raise ValueError("boom")
        return "ok"

    worker(app)
    result = job.delay(outcome == "failure")
    result.get(timeout=10, propagate=False)
    # No wait: a client that saw the result can enqueue again at once.
    assert not lock_info(locks, call_key(job, (outcome == "failure",))).held
    assert job.delay(outcome == "failure").id != result.id
    state = "SUCCESS" if outcome == "success" else "FAILURE"
    assert (state, True, "run") in [(r["reason"], r["released"], r["stage"]) for r in released]


def test_runtime_duplicate_is_skipped_and_never_releases_the_running_lock(
    app: Celery,
    locks: redis.Redis,
    worker: Any,
    capture: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started, proceed = threading.Event(), threading.Event()
    duplicates, released = capture(singleton_duplicate), capture(singleton_released)
    runs: list[str] = []

    @app.task(base=SingletonTask, bind=True)
    def job(self: Any, a: int) -> None:
        runs.append(self.request.id)
        started.set()
        proceed.wait(10)

    worker(app)
    running = job.delay(1)
    assert started.wait(10)
    owner = lock_info(locks, call_key(job, (1,))).owner
    with caplog.at_level(logging.INFO, logger="celery_redislock"):
        bypass = app.send_task(job.name, args=(1,))  # beat or a foreign producer
        wait_until(lambda: duplicates, what="the duplicate signal")
    assert [(d["task_id"], d["existing_id"], d["action"], d["stage"]) for d in duplicates] == [
        (bypass.id, running.id, "skip", "run")
    ]
    assert f"{job.name}[{bypass.id}] skipped" in caplog.text
    assert lock_info(locks, call_key(job, (1,))).owner == owner  # untouched
    assert released == []
    proceed.set()
    running.get(timeout=10)
    assert runs == [running.id]
    assert bypass.state == "FAILURE"  # terminal: .get() raises DuplicateTask at once


def test_runtime_duplicate_rescheduled_runs_later_without_counting_a_retry(
    app: Celery, worker: Any, capture: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()
    duplicates = capture(singleton_duplicate)

    @app.task(
        base=SingletonTask,
        bind=True,
        on_running_duplicate="reschedule",
        reschedule_countdown=0.2,
        max_retries=0,
    )
    def job(self: Any) -> int:
        started.set()
        proceed.wait(10)
        return int(self.request.retries)

    worker(app)
    running = job.delay()
    assert started.wait(10)
    bypass = app.send_task(job.name)
    wait_until(lambda: duplicates, what="a reschedule")
    time.sleep(0.5)  # rescheduled at least twice while the first copy runs
    proceed.set()
    assert running.get(timeout=10) == 0
    assert app.AsyncResult(bypass.id).get(timeout=10) == 0  # ran, retries untouched
    assert {d["action"] for d in duplicates} == {"reschedule"} and len(duplicates) >= 2


def test_broker_redelivery_of_a_running_message_never_runs_beside_it(
    app: Celery, worker: Any, capture: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()
    published: list[dict[str, Any]] = []
    duplicates = capture(singleton_duplicate)
    runs: list[str] = []

    def remember(headers: dict[str, Any], **_: Any) -> None:
        published.append(dict(headers))

    @app.task(base=SingletonTask, bind=True)
    def job(self: Any) -> None:
        runs.append(self.request.id)
        started.set()
        proceed.wait(10)

    before_task_publish.connect(remember, weak=False)
    try:
        worker(app, concurrency=3)
        running = job.delay()
        assert started.wait(10)
        ours = {k: published[0][k] for k in (TOKEN_HEADER, KEY_HEADER)}
        # The same message again (same id, same headers), as the broker redelivers it
        # after visibility_timeout while the first delivery still runs.
        Task.apply_async(job, task_id=running.id, headers=ours)
        wait_until(lambda: duplicates, what="the redelivered copy's skip")
    finally:
        before_task_publish.disconnect(remember)
    proceed.set()
    running.get(timeout=10)
    assert runs == [running.id]
    assert [(d["task_id"], d["existing_id"], d["action"]) for d in duplicates] == [
        (running.id, running.id, "skip")
    ]


def test_lapsed_queued_lease_still_runs(
    app: Celery, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(base=SingletonTask, lock_queued_ttl=0.1)
    def job() -> str:
        return "ran"

    result = job.delay()
    time.sleep(0.3)  # longer in the queue than its lease
    with caplog.at_level(logging.WARNING, logger="celery_redislock"):
        worker(app)
        assert result.get(timeout=10) == "ran"
    assert "queued lease" in caplog.text and "had lapsed" in caplog.text


def test_retry_keeps_the_lock_through_the_countdown(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    lost = capture(lease_lost)
    released = capture(singleton_released)
    retried = threading.Event()

    @app.task(base=SingletonTask, bind=True, lock_ttl=0.5, lock_queued_ttl=5, max_retries=1)
    def job(self: Any) -> int:
        if self.request.retries == 0:
            retried.set()
            raise self.retry(countdown=1.5)
        return int(self.request.retries)

    key = call_key(job)
    worker(app)
    result = job.delay()
    assert retried.wait(10)
    time.sleep(0.8)  # past lock_ttl, inside the countdown
    info = lock_info(locks, key)
    assert info.held and parse_owner(info.owner)[0] == result.id
    assert 5 < info.ttl_left < 6.5  # lock_queued_ttl + countdown
    assert job.delay().id == result.id  # still the same job
    assert result.get(timeout=10) == 1
    assert not lock_info(locks, key).held
    assert lost == []
    assert [r["reason"] for r in released] == ["SUCCESS"]  # attempt 1 released nothing


def test_autoretry_without_countdown_hands_over_between_attempts(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    lost, acquired = capture(lease_lost), capture(singleton_acquired)
    attempts: list[int] = []

    @app.task(
        base=SingletonTask,
        bind=True,
        autoretry_for=(KeyError,),
        retry_kwargs={"countdown": 0, "max_retries": 3},
    )
    def job(self: Any) -> int:
        attempts.append(self.request.retries)
        if self.request.retries < 3:
            raise KeyError("again")
        return len(attempts)

    worker(app, concurrency=4)
    result = job.delay()
    assert result.get(timeout=10) == 4
    assert attempts == [0, 1, 2, 3]
    assert [a["stage"] for a in acquired] == ["enqueue", "run", "run", "run", "run"]
    assert lost == [] and not lock_info(locks, call_key(job)).held


def test_retries_exhausted_release_the_lock(app: Celery, locks: redis.Redis, worker: Any) -> None:
    @app.task(base=SingletonTask, bind=True, max_retries=1)
    def job(self: Any) -> None:
        raise self.retry(countdown=0, exc=ValueError("always"))

    worker(app)
    result = job.delay()
    with pytest.raises(ValueError, match="always"):
        result.get(timeout=10)
    assert not lock_info(locks, call_key(job)).held


def test_revoked_before_start_releases_the_queued_lease(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    released = capture(singleton_released)

    @app.task(base=SingletonTask)
    def job() -> None:
        pass

    worker(app)
    # An ETA message waits in the worker, which checks revokes when it comes due (a
    # message already handed to a thread pool's queue would run regardless).
    result = job.apply_async(countdown=0.5)
    result.revoke()
    assert lock_info(locks, call_key(job)).held  # still queued
    wait_until(lambda: not lock_info(locks, call_key(job)).held, what="release on revoke")
    assert result.state == "REVOKED"
    assert [(r["reason"], r["stage"]) for r in released] == [("revoked", "cleanup")]


def test_revoke_terminate_releases_the_running_lease(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    @app.task(base=SingletonTask, lock_ttl=30)
    def job() -> None:
        locks.set("terminate-started", 1)
        time.sleep(30)

    worker(app, pool="prefork", concurrency=1)
    result = job.delay()
    wait_until(lambda: locks.get("terminate-started"), what="the run to start")
    assert lock_info(locks, call_key(job)).held
    result.revoke(terminate=True)
    # Released long before lock_ttl (30 s): by the child's postrun and the main process.
    wait_until(
        lambda: not lock_info(locks, call_key(job)).held, timeout=5, what="release after terminate"
    )
    wait_until(lambda: result.state == "REVOKED", what="REVOKED")


def test_mode_while_running_locks_only_the_run(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    duplicates = capture(singleton_duplicate)
    started, proceed = threading.Event(), threading.Event()
    runs: list[str] = []

    @app.task(base=SingletonTask, bind=True, singleton_mode="while_running")
    def job(self: Any) -> None:
        runs.append(self.request.id)
        started.set()
        proceed.wait(10)

    first, second = job.delay(), job.delay()
    assert first.id != second.id  # no lock while queued
    assert locks.keys("*:holders") == []
    worker(app, concurrency=2)
    assert started.wait(10)
    wait_until(lambda: duplicates, what="the second copy skipped")
    proceed.set()
    wait_until(lambda: not lock_info(locks, call_key(job)).held, what="release")
    assert len(runs) == 1 and [d["action"] for d in duplicates] == ["skip"]


def test_mode_until_started_lets_a_new_copy_queue_while_running(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, singleton_mode="until_started")
    def job() -> str:
        started.set()
        proceed.wait(10)
        return "done"

    first = job.delay()
    assert job.delay().id == first.id  # both queued: one job
    worker(app, concurrency=1)
    assert started.wait(10)
    wait_until(lambda: not lock_info(locks, call_key(job)).held, what="release at start")
    second = job.delay()  # accepted while the first runs
    assert second.id != first.id
    assert job.delay().id == second.id
    proceed.set()
    assert first.get(timeout=10) == second.get(timeout=10) == "done"


def test_mode_interval_keeps_the_lock_after_the_run(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    @app.task(base=SingletonTask, singleton_mode="interval", singleton_interval=1.0)
    def job() -> str:
        return "done"

    worker(app)
    first = job.delay()
    assert first.get(timeout=10) == "done"
    info = lock_info(locks, call_key(job))
    assert info.held and 0.5 < info.ttl_left <= 1.0
    assert job.delay().id == first.id  # within the interval: the last run's result
    wait_until(lambda: not lock_info(locks, call_key(job)).held, timeout=3, what="expiry")
    second = job.delay()
    assert second.id != first.id and second.get(timeout=10) == "done"


def test_mode_interval_refusal_says_the_holder_finished(
    app: Celery, locks: redis.Redis, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """#29 item 6: after the run, the interval keeps the lock under the run's owner id;
    a refused call must not say that copy "is running"."""
    proceed = threading.Event()

    @app.task(
        base=SingletonTask, singleton_mode="interval", singleton_interval=30, on_duplicate="raise"
    )
    def job() -> str:
        proceed.wait(10)
        return "done"

    worker(app)
    first = job.delay()
    wait_until(lambda: parse_owner(lock_info(locks, call_key(job)).owner)[1], what="start")
    with pytest.raises(DuplicateTask, match="is running"):  # really running: said so
        job.delay()
    proceed.set()
    assert first.get(timeout=10) == "done"
    with pytest.raises(DuplicateTask) as refused:
        job.delay()
    assert "is running" not in str(refused.value)
    assert "finished (SUCCESS)" in str(refused.value) and "singleton_interval" in str(refused.value)
    assert refused.value.task_id == first.id
    caplog.set_level(logging.INFO, logger="celery_redislock")
    assert job.apply_async(on_duplicate="existing").id == first.id
    assert "is running" not in caplog.text and "finished (SUCCESS)" in caplog.text


def test_lost_lease_is_reported_and_the_task_goes_on(
    app: Celery,
    locks: redis.Redis,
    worker: Any,
    capture: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost, released = capture(lease_lost), capture(singleton_released)
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, lock_ttl=0.3)
    def job() -> str:
        started.set()
        proceed.wait(10)
        return "finished anyway"

    worker(app)
    result = job.delay()
    assert started.wait(10)
    with caplog.at_level(logging.ERROR, logger="celery_redislock"):
        RedisLock(locks, call_key(job)).force_release()  # an operator clears it
        wait_until(lambda: lost, timeout=3, what="lease_lost")
    assert [(x["task_id"], x["kind"]) for x in lost] == [(result.id, "lock")]
    assert "lost its singleton lock" in caplog.text
    proceed.set()
    assert result.get(timeout=10) == "finished anyway"
    assert [(r["reason"], r["released"]) for r in released] == [("SUCCESS", False)]


@pytest.mark.parametrize("grace", [True, False])
def test_a_running_singleton_across_a_lock_redis_restart(
    make_app: MakeApp, worker: Any, capture: Any, grace: bool
) -> None:
    """The lock Redis restarts empty while the singleton runs. With the restart grace
    (default) the run's renewal puts its lock back: a copy sent then is a duplicate of
    the running one and nothing is reported lost. Without it the lock is reported lost
    and a copy would run beside the first."""
    lost = capture(lease_lost)
    started, proceed = threading.Event(), threading.Event()
    with RedisServer() as lock_server:
        app = make_app(redislock_url=lock_server.url, redislock_restart_grace=grace)

        @app.task(base=SingletonTask, lock_ttl=3.0)
        def job() -> str:
            started.set()
            proceed.wait(10)
            return "done"

        worker(app)
        result = job.delay()
        assert started.wait(10)
        lock_server.restart()  # empty: the lock is gone, the run goes on
        if grace:
            lock = RedisLock(redis.Redis.from_url(lock_server.url), call_key(job))
            wait_until(lock.locked, timeout=5, what="the lock put back by the run's renewal")
            assert job.delay().id == result.id and not lost  # a duplicate of the running one
        else:
            wait_until(lambda: lost, timeout=5, what="lease_lost after the restart")
            assert job.delay().id != result.id  # would run beside the first
        proceed.set()
        assert result.get(timeout=10) == "done"

        def sent() -> Any:  # a free lock within the grace: RedisRestarting, retried
            with contextlib.suppress(RedisRestarting):
                return job.delay()
            return None

        assert wait_until(sent, timeout=10).id != result.id  # the lock works again


@pytest.mark.parametrize("how", ["decorator", "subclass", "annotations"])
def test_options_are_set_three_ways(make_app: MakeApp, how: str) -> None:
    app = make_app()
    if how == "annotations":
        app.conf.task_annotations = {f"{app.main}.{__name__}.job": {"on_duplicate": "raise"}}

    class RaisingTask(SingletonTask):  # type: ignore[type-arg]
        on_duplicate = "raise"

    base: Any = RaisingTask if how == "subclass" else SingletonTask
    options = {"on_duplicate": "raise"} if how == "decorator" else {}

    @app.task(base=base, **options)
    def job() -> None:
        pass

    assert job.on_duplicate == "raise"
    first = job.delay()
    with pytest.raises(Exception, match="not sent") as raised:
        job.delay()
    assert getattr(raised.value, "task_id", None) == first.id


def test_settings_through_the_celery_namespace(redis_url: str, locks: redis.Redis) -> None:
    class DjangoSettings:  # what a Django project's settings.py holds
        CELERY_BROKER_URL = db_url(redis_url, BROKER_DB)
        CELERY_RESULT_BACKEND = db_url(redis_url, RESULTS_DB)
        CELERY_REDISLOCK_URL = db_url(redis_url, LOCKS_DB)
        CELERY_REDISLOCK_PREFIX = "myproj"
        CELERY_REDISLOCK_QUEUED_TTL = 120
        CELERY_REDISLOCK_ON_DUPLICATE = "raise"

    app = Celery("namespaced", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")

    @app.task(base=SingletonTask, shared=False)
    def job() -> None:
        pass

    try:
        first = job.delay()
        info = RedisLock(locks, call_key(job), prefix="myproj").info()
        assert info.held and 110 < info.ttl_left <= 120
        with pytest.raises(Exception, match="not sent") as raised:
            job.delay()
        assert getattr(raised.value, "task_id", None) == first.id
    finally:
        app.close()


def test_visibility_timeout_redelivery_never_runs_beside_the_first_run(
    make_app: MakeApp, worker: Any, capture: Any
) -> None:
    # The Redis transport redelivers an unacknowledged (acks_late) message once it has
    # been out longer than visibility_timeout: here while its first run still runs.
    app = make_app(
        broker_transport_options={
            "visibility_timeout": 1,
            "unacked_restore_interval": 0.5,
            "unacked_restore_throttle": 1,
        }
    )
    duplicates = capture(singleton_duplicate)
    runs: list[float] = []

    @app.task(base=SingletonTask, acks_late=True, lock_ttl=0.5)
    def job() -> str:
        runs.append(time.monotonic())
        time.sleep(4)
        return "done"

    worker(app, concurrency=3)
    result = job.delay()
    assert result.get(timeout=20) == "done"
    wait_until(
        lambda: any(d["action"] == "skip" for d in duplicates),
        timeout=10,
        what="the redelivered copy skipped",
    )
    assert len(runs) == 1
    assert {d["existing_id"] for d in duplicates} == {result.id}
