"""Bounded-concurrency options, settings and ``@bounded_task``: validation and wiring,
without Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redislock import (
    ConfigurationError,
    RedisLockTask,
    SingletonTask,
    bounded_task,
)
from celery_redislock.celery.bounded.guard import CONCURRENCY, permit_owner
from celery_redislock.celery.bounded.settings import (
    DEFAULT_COUNTDOWN,
    DEFAULT_JITTER,
    DEFAULT_WAIT,
    check_limits,
)
from celery_redislock.celery.options import options_of
from celery_redislock.celery.ratelimit.guard import RATE
from celery_redislock.celery.singleton.guard import SINGLETON
from celery_redislock.celery.tokens import parse_owner


def noop(*args: Any, **kwargs: Any) -> None:
    """A task body."""


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("bounded", set_as_current=False)
    yield app
    app.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_limit": 0}, "option concurrency_limit must be an int >= 1, got 0"),
        ({"concurrency_limit": -2}, "option concurrency_limit must be an int >= 1, got -2"),
        ({"concurrency_limit": True}, "option concurrency_limit must be an int >= 1, got True"),
        ({"concurrency_limit": 2.5}, "option concurrency_limit must be an int >= 1, got 2.5"),
        ({"concurrency_limit": "3"}, "option concurrency_limit must be an int >= 1, got '3'"),
        (
            {"concurrency_limit": 3, "concurrency_key": 7},
            "option concurrency_key must be a pool name .* got 7",
        ),
        (
            {"concurrency_limit": 3, "concurrency_key": ""},
            "option concurrency_key must be a pool name .* got ''",
        ),
        (
            {"concurrency_key": "stripe-api"},
            "option concurrency_key='stripe-api' needs concurrency_limit .* got None",
        ),
        (
            {"concurrency_limit": 3, "concurrency_countdown": 0},
            "option concurrency_countdown must be a number of seconds > 0, got 0",
        ),
        (
            {"concurrency_limit": 3, "concurrency_jitter": -1},
            "option concurrency_jitter must be a number of seconds >= 0, got -1",
        ),
        (
            {"concurrency_limit": 3, "concurrency_wait": "1"},
            "option concurrency_wait must be a number of seconds >= 0, got '1'",
        ),
        (
            {"concurrency_limit": 3, "concurrency_waiters": -1},
            "option concurrency_waiters must be an int >= 0, got -1",
        ),
    ],
)
def test_a_bad_option_names_task_option_and_value(
    app: Celery, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"task 'bounded\.bad': {message}"):
        app.task(base=RedisLockTask, name="bounded.bad", shared=False, lazy=False, **options)(noop)


@pytest.mark.parametrize("limit", [None, 0, "2"])
def test_bounded_task_checks_its_limit_at_once(app: Celery, limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="concurrency_limit"):
        bounded_task(app=app, concurrency_limit=limit)(noop)


def test_bounded_task_checks_a_bad_option_before_defining_the_task(app: Celery) -> None:
    # Checked when the decorator gets the function: the error names the task.
    with pytest.raises(ConfigurationError, match="option concurrency_wait must be"):
        bounded_task(app=app, concurrency_limit=2, concurrency_wait=-1)(noop)
    with pytest.raises(ConfigurationError, match="base must be a subclass"):
        bounded_task(app=app, concurrency_limit=2, base=object)
    with pytest.raises(ConfigurationError, match="app must be a Celery app"):
        bounded_task(app="app", concurrency_limit=2)  # type: ignore[call-overload]


def test_bounded_task_defaults(app: Celery) -> None:
    task = bounded_task(app=app, concurrency_limit=4, shared=False)(noop)
    assert isinstance(task, RedisLockTask) and not task.singleton
    options = options_of(task).bounded
    assert options.enabled and options.limit == 4 and options.key is None
    assert options.pool(task, [], {}) == task.name  # the pool defaults to the task name
    assert (options.countdown, options.jitter, options.wait) == (
        DEFAULT_COUNTDOWN,
        DEFAULT_JITTER,
        DEFAULT_WAIT,
    )
    assert options.waiters_of(4) == 4  # as many waiters as the limit
    # The singleton first; the rate last (#25): an admitted run starts at once.
    assert task.redislock_guards == (SINGLETON, CONCURRENCY, RATE)


def test_bounded_task_as_a_singleton_too(app: Celery) -> None:
    one = bounded_task(app=app, concurrency_limit=5, singleton=True, shared=False)(noop)
    other = bounded_task(
        app=app, concurrency_limit=5, base=SingletonTask, name="other", shared=False
    )(noop)
    assert one.singleton and other.singleton
    assert options_of(one).bounded.limit == options_of(other).bounded.limit == 5


def test_a_plain_task_is_not_bounded(app: Celery) -> None:
    task = app.task(base=RedisLockTask, shared=False)(noop)
    assert not options_of(task).bounded.enabled


def test_pool_names(app: Celery) -> None:
    shared = bounded_task(app=app, concurrency_limit=2, concurrency_key="stripe-api", shared=False)(
        noop
    )
    tenant = bounded_task(
        app=app,
        concurrency_limit=2,
        name="tenant",
        shared=False,
        concurrency_key=lambda customer, **kw: f"c:{customer}",
    )(noop)
    assert options_of(shared).bounded.pool(shared, [1], {}) == "stripe-api"
    assert options_of(tenant).bounded.pool(tenant, [42], {"amount": 5}) == "c:42"
    bad = bounded_task(
        app=app, concurrency_limit=2, name="bad", shared=False, concurrency_key=lambda n: None
    )(noop)
    with pytest.raises(ConfigurationError, match=r"must return a non-empty string .* got None"):
        options_of(bad).bounded.pool(bad, [1], {})


def test_settings_give_defaults_and_per_pool_limits(app: Celery) -> None:
    task = bounded_task(
        app=app, concurrency_limit=2, concurrency_key="api", shared=False, concurrency_jitter=0
    )(noop)
    app.conf.update(
        redislock_concurrency_countdown=3,
        redislock_concurrency_jitter=1,
        redislock_concurrency_wait=0,
        redislock_concurrency_waiters=1,
        redislock_concurrency_limits={"api": 7},
    )
    options = options_of(task).bounded
    assert (options.countdown, options.jitter, options.wait) == (3.0, 0.0, 0.0)  # task wins
    assert options.waiters_of(7) == 1
    assert options.limit_of("api") == 7 and options.limit_of("other") == 2
    app.conf.redislock_concurrency_limits = {"api": 1}  # read again after a change
    assert options_of(task).bounded.limit_of("api") == 1


def test_annotations_set_the_limit(app: Celery) -> None:
    app.conf.task_annotations = {"bounded.annotated": {"concurrency_limit": 9}}
    task = bounded_task(app=app, concurrency_limit=2, name="bounded.annotated", shared=False)(noop)
    assert options_of(task).bounded.limit == 9


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([("api", 3)], r"must be a dict \{pool name: limit\}"),
        ({"": 3}, "pool names must be non-empty strings"),
        ({"api": 0}, r"redislock_concurrency_limits\['api'\] must be an int >= 1, got 0"),
    ],
)
def test_bad_limits_setting(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_limits(value)


def test_permit_owner_is_derived_from_the_message_seed() -> None:
    owner = permit_owner("task-1", "token-abc")
    assert owner == permit_owner("task-1", "token-abc")  # the main process recomputes it
    assert owner != permit_owner("task-1", "token-other")  # another delivery's
    assert parse_owner(owner) == ("task-1", True)
    assert permit_owner("task-1", None) != permit_owner("task-1", None)  # random
