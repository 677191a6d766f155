"""The per-call fast paths give the same answers as the slow ones they stand in for."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redislock import Lease
from celery_redislock.celery.config import settings_for
from celery_redislock.celery.options import options_of
from celery_redislock.celery.singleton.binding import bind_arguments
from celery_redislock.celery.upstream import conf_fingerprint
from celery_redislock.core.renewal.scheduler import Renewer


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit", set_as_current=False, broker="memory://", backend="cache+memory://")
    yield app
    app.close()


def _inspect_bind(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return TypeError
    given = set(bound.arguments)
    bound.apply_defaults()
    return dict(bound.arguments), frozenset(bound.arguments.keys() - given)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {}),
        ((1, 2), {}),
        ((), {"a": 1}),
        ((1,), {"b": 3}),
        ((1,), {"c": 4}),
        ((), {"c": 4, "a": 1}),
        ((1, 2, 3), {}),  # too many positionals
        ((1,), {"a": 1}),  # given twice
        ((), {}),  # a required argument missing
        ((1,), {"zzz": 1}),  # unknown keyword
    ],
)
def test_simple_signatures_bind_as_inspect_does(
    app: Celery, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    def body(a: int, b: int = 2, *, c: int = 3) -> None: ...

    task = app.task(shared=False)(body)
    expected = _inspect_bind(body, args, kwargs)
    if expected is TypeError:
        with pytest.raises(TypeError):
            bind_arguments(task, args, kwargs)
    else:
        assert bind_arguments(task, args, kwargs) == expected


def test_fingerprint_sees_changes_of_value_type_and_in_place(app: Celery) -> None:
    keys = ("redislock_lock_ttl", "redislock_client_options")
    assert app.conf.task_serializer  # loads the configuration
    app.conf.update(redislock_lock_ttl=1, redislock_client_options={"a": 1})
    first = conf_fingerprint(app, keys)
    assert first is not None and conf_fingerprint(app, keys) == first
    app.conf.redislock_lock_ttl = 1.0  # equal, but another type: checked again
    second = conf_fingerprint(app, keys)
    assert second != first
    app.conf.redislock_client_options["a"] = 2  # a dict changed in place
    assert conf_fingerprint(app, keys) != second


def test_cached_options_follow_class_and_instance_changes(app: Celery) -> None:
    from celery_redislock import SingletonTask

    @app.task(base=SingletonTask, shared=False)
    def lazy() -> None: ...

    job = app.tasks[lazy.name]  # the task itself, not @app.task's proxy
    assert options_of(job).singleton.lock_ttl == settings_for(app).lock_ttl
    type(job).lock_ttl = 7.0
    assert options_of(job).singleton.lock_ttl == 7.0
    job.lock_ttl = 9.0  # set on the instance
    assert options_of(job).singleton.lock_ttl == 9.0
    app.conf.redislock_queued_ttl = 11.0
    assert options_of(job).singleton.queued_ttl == 11.0


class _Holder:
    """A lease holder that records the calls a lease makes."""

    name = "held"

    def __init__(self, extend_ok: bool = True) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.extend_ok = extend_ok

    def _release_token(self, token: str) -> bool:
        self.calls.append(("release", token, 0))
        return True

    def _extend_token(self, token: str, ttl_ms: int) -> bool:
        self.calls.append(("extend", token, ttl_ms))
        return self.extend_ok


def test_hand_over_stops_renewal_sets_the_ttl_and_forgets_the_lease() -> None:
    holder = _Holder()
    lease = Lease(holder, "tok", 1, 30.0)
    stopped: list[bool] = []

    class Place:  # the lease's place in a renewer that renews nothing (generation 0)
        def __call__(self) -> None:
            stopped.append(True)

        def explicit(self, ttl: float) -> int:
            return 0

        def rescheduled(self, sent_at: float, ttl: float) -> None:
            pass

    lease._stop_renewal = Place()
    assert lease.hand_over(120.0) is True
    assert stopped == [True] and holder.calls == [("extend", "tok", 120_000)]
    assert lease.released and not lease.lost
    assert lease.release() is False and lease.hand_over(5.0) is False
    assert holder.calls == [("extend", "tok", 120_000)]  # nothing more was sent


def test_hand_over_of_a_lease_no_longer_held_answers_false() -> None:
    lease = Lease(_Holder(extend_ok=False), "tok", 1, 30.0)
    assert lease.hand_over(1.0) is False
    assert lease.released


class _Renewable:
    """Just enough of a lock for the renewer's bookkeeping (nothing is ever due)."""

    client = object()
    _renew_keys = ("k",)
    _renew_script: Any = None


def test_a_lease_due_later_than_the_scheduler_wakes_does_not_wake_it() -> None:
    renewer = Renewer()
    holder = _Renewable()
    first = Lease(holder, "a", 1, 600.0)  # type: ignore[arg-type]
    entry = renewer.add(first, holder, None)  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    while renewer._wake_at == float("inf") and time.monotonic() < deadline:
        time.sleep(0.01)  # until the new thread sleeps
    assert renewer._wake_at < float("inf")
    woken: list[bool] = []
    original = renewer._cond.notify
    renewer._cond.notify = lambda n=1: woken.append(True) or original(n)  # type: ignore[method-assign]
    later = Lease(holder, "b", 2, 900.0)  # type: ignore[arg-type]
    entries = [entry, renewer.add(later, holder, None)]  # type: ignore[arg-type]
    assert woken == []
    sooner = Lease(holder, "c", 3, 30.0)  # type: ignore[arg-type]
    entries.append(renewer.add(sooner, holder, None))  # type: ignore[arg-type]
    assert woken == [True]
    for stop in entries:
        stop()
    assert renewer.tracked == 0 and isinstance(renewer._thread, threading.Thread)


def _equal_calls() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    # Equal in Python (and so in a dict) but not one job: each must keep its own key.
    return [
        ((1,), {}),
        ((True,), {}),
        ((1.0,), {}),
        ((-0.0,), {}),
        (("1",), {}),
        ((None,), {}),
        ((1, 3), {}),
        (([1],), {}),
    ]


def test_calls_equal_in_python_but_not_one_job_keep_their_own_keys(app: Celery) -> None:
    # Replaces the tests of the call-key memo (removed, #30): the keys it stood in for.
    from celery_redislock.celery.singleton.signature import call_key

    @app.task(shared=False)
    def f(a: Any, b: int = 2) -> None: ...

    keys = [call_key(f, args, kwargs) for args, kwargs in _equal_calls()]
    assert len(set(keys)) == len(keys)
    assert keys == [call_key(f, args, kwargs) for args, kwargs in _equal_calls()]
    assert call_key(f, (1,)) == call_key(f, (), {"a": 1}) == call_key(f, (1, 2))


def test_keys_follow_the_task_options(app: Celery) -> None:
    from celery_redislock import SingletonTask
    from celery_redislock.celery.singleton.signature import call_key

    @app.task(shared=False, base=SingletonTask)
    def lazy(a: int, b: int) -> None: ...

    job = app.tasks[lazy.name]  # the task itself, not @app.task's proxy
    assert call_key(job, (1, 2)) != call_key(job, (1, 3))
    type(job).unique_on = ["a"]  # as task_annotations would, after the first calls
    assert call_key(job, (1, 2)) == call_key(job, (1, 3))
    type(job).unique_on = None
    type(job).lock_key = staticmethod(lambda a, b: f"k{a}")
    assert call_key(job, (1, 2)) == "k1"


def test_keys_follow_a_default_changed_in_place(app: Celery) -> None:
    from celery_redislock import SingletonTask
    from celery_redislock.celery.singleton.signature import call_key

    regions = ["eu"]

    @app.task(base=SingletonTask, shared=False)
    def report(a: int, b: int = 0, where: list[str] = regions) -> None: ...

    first = call_key(report, (1,))
    regions.append("us")  # the default the next call gets
    assert call_key(report, (1,)) != first
    assert call_key(report, (1,), {"where": ["eu"]}) == first


def test_an_unbounded_run_still_refuses_a_key_without_a_limit(app: Celery) -> None:
    from celery_redislock import RedisLockTask
    from celery_redislock.celery.bounded.guard import CONCURRENCY
    from celery_redislock.celery.execution import RunState
    from celery_redislock.errors import ConfigurationError

    @app.task(base=RedisLockTask, shared=False)
    def lazy() -> None: ...

    job = app.tasks[lazy.name]
    run = RunState(job, "id-1")
    assert CONCURRENCY.enter(job, run, (), {}) is None
    job.concurrency_key = "pool"  # set on the instance, after the task was bound
    with pytest.raises(ConfigurationError, match="needs concurrency_limit"):
        CONCURRENCY.enter(job, run, (), {})


def test_kept_locks_follow_the_client_settings(app: Celery) -> None:
    from celery_redislock import SingletonTask
    from celery_redislock.celery.client import get_redis
    from celery_redislock.celery.singleton.leases import lock_for

    @app.task(base=SingletonTask, shared=False)
    def lazy() -> None: ...

    job = app.tasks[lazy.name]
    app.conf.redislock_url = "redis://h1:6379/0"
    first = lock_for(job, "k", options_of(job).singleton)
    assert lock_for(job, "k", options_of(job).singleton) is first
    assert first.client is get_redis(app)
    app.conf.redislock_url = "redis://h2:6379/0"
    second = lock_for(job, "k", options_of(job).singleton)
    assert second is not first and second.client is get_redis(app)
    assert second.client.connection_pool.connection_kwargs["host"] == "h2"
    app.conf.redislock_prefix = "other"
    assert lock_for(job, "k", options_of(job).singleton) is not second
