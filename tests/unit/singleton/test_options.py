"""Task options, owner ids and decorators: validation and wiring, without Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task, shared_task

from celery_redislock import (
    ConfigurationError,
    RedisLockTask,
    SingletonTask,
    singleton_task,
)
from celery_redislock.celery.options import options_of
from celery_redislock.celery.singleton.options import MODES
from celery_redislock.celery.tokens import parse_owner, queued_owner, run_token, running_owner


def noop() -> None:
    """A task body."""


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("options", set_as_current=False)
    yield app
    app.close()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("singleton", "yes", "option singleton must be True or False, got 'yes'"),
        ("singleton_mode", "forever", r"option singleton_mode must be one of .* got 'forever'"),
        ("lock_ttl", 0, "option lock_ttl must be a finite number of seconds > 0, got 0"),
        ("lock_ttl", "30", r"option lock_ttl must be a number of seconds > 0, got '30'"),
        ("lock_queued_ttl", -5, "option lock_queued_ttl must be .* > 0, got -5"),
        ("on_duplicate", "ignore", r"option on_duplicate must be one of .* got 'ignore'"),
        ("on_running_duplicate", "wait", r"option on_running_duplicate .* got 'wait'"),
        ("reschedule_countdown", float("nan"), "option reschedule_countdown .* got nan"),
        ("singleton_interval", True, r"option singleton_interval .* got True"),
        ("lock_key", "user-1", "option lock_key must be callable, got 'user-1'"),
    ],
)
def test_a_bad_option_names_task_option_and_value(
    app: Celery, option: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"task 'options\.bad': {message}"):
        app.task(
            base=SingletonTask, name="options.bad", shared=False, lazy=False, **{option: value}
        )(noop)


def test_interval_mode_needs_an_interval(app: Celery) -> None:
    with pytest.raises(
        ConfigurationError, match="singleton_mode='interval' needs option singleton_interval"
    ):
        app.task(base=SingletonTask, singleton_mode="interval", shared=False, lazy=False)(noop)


def test_a_bad_unique_on_is_named_at_call_time(app: Celery) -> None:
    @app.task(base=SingletonTask, unique_on=["nope"], shared=False)
    def job(a: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"unique_on of task .* names 'nope'"):
        job.apply_async((1,))


def test_defaults_come_from_the_app_settings(app: Celery) -> None:
    @app.task(base=SingletonTask, shared=False)
    def job() -> None:
        pass

    options = options_of(job).singleton
    assert (
        options.enabled,
        options.mode,
        options.lock_ttl,
        options.queued_ttl,
        options.on_duplicate,
        options.on_running_duplicate,
    ) == (True, "until_done", 30.0, 3600.0, "existing", "skip")
    app.conf.update(
        redislock_lock_ttl=5,
        redislock_queued_ttl=60,
        redislock_on_duplicate="raise",
        redislock_prefix="p",
    )
    options = options_of(job).singleton
    assert (options.lock_ttl, options.queued_ttl, options.on_duplicate, options.prefix) == (
        5.0,
        60.0,
        "raise",
        "p",
    )
    job.lock_ttl = 2  # type: ignore[attr-defined]  # the task's own option wins
    assert options_of(job).singleton.lock_ttl == 2.0


def test_modes_are_named() -> None:
    assert MODES == (
        "until_done",
        "while_running",
        "until_started",
        "interval",
        "until_and_while_executing",
    )


def test_owner_ids_tell_task_id_and_state() -> None:
    assert parse_owner(queued_owner("abc")) == ("abc", False)
    assert parse_owner(running_owner("abc")) == ("abc", True)
    assert parse_owner(running_owner("a@b#c")) == ("a@b#c", True)  # any task id
    assert queued_owner("abc") != queued_owner("abc")  # never re-enters by owner
    assert parse_owner("someone") == ("someone", None)
    assert parse_owner(None) == (None, None)
    assert run_token("t") == run_token("t") != run_token("u")
    assert len(run_token("t")) == 32


def test_singleton_task_bare_with_options_and_app(app: Celery) -> None:
    @singleton_task
    def shared_one() -> None:
        pass

    @singleton_task(lock_ttl=10, on_duplicate="raise")
    def shared_two() -> None:
        pass

    @singleton_task(app=app, bind=True, name="options.own", unique_on=["a"])
    def own(self: Any, a: int, b: int = 0) -> int:
        return a

    task = app.tasks["options.own"]
    assert own.name == "options.own" and isinstance(task, SingletonTask)
    assert task.unique_on == ["a"] and task(3) == 3
    probe = Celery("probe", set_as_current=False)  # shared tasks join every app
    try:
        names = [n for n in probe.tasks if n.endswith(("shared_one", "shared_two"))]
        assert len(names) == 2
        for name in names:
            task = probe.tasks[name]
            assert isinstance(task, SingletonTask) and task.singleton is True
        two = next(n for n in names if n.endswith("shared_two"))
        assert probe.tasks[two].lock_ttl == 10 and probe.tasks[two].on_duplicate == "raise"
    finally:
        probe.close()


def test_singleton_task_switches_the_lock_on_for_a_redislock_base(app: Celery) -> None:
    @singleton_task(app=app, base=RedisLockTask, shared=False)
    def job() -> None:
        pass

    assert job.singleton is True


def test_singleton_task_checks_its_options_at_once() -> None:
    # Checked when the decorator gets the function, so the error names the task.
    def refresh() -> None: ...

    with pytest.raises(ConfigurationError, match="option on_duplicate must be one of") as caught:
        singleton_task(on_duplicate="skip")(refresh)  # type: ignore[call-overload]
    assert ".refresh'" in str(caught.value)
    with pytest.raises(ConfigurationError, match="base must be a subclass of"):
        singleton_task(base=Task)
    with pytest.raises(ConfigurationError, match="app must be a Celery app"):
        singleton_task(app="proj")  # type: ignore[call-overload]


def test_plain_redislock_task_takes_no_lock(app: Celery) -> None:
    @app.task(base=RedisLockTask, shared=False)
    def job() -> None:
        pass

    assert options_of(job).singleton.enabled is False


def test_shared_task_with_our_base_works() -> None:
    @shared_task(base=SingletonTask, on_duplicate="raise", name="options.shared")
    def job() -> None:
        pass

    probe = Celery("probe", set_as_current=False)
    try:
        assert probe.tasks["options.shared"].on_duplicate == "raise"
    finally:
        probe.close()


def test_options_inherited_from_a_base_are_checked_at_definition(app: Celery) -> None:
    class Sloppy(SingletonTask):  # type: ignore[type-arg]
        on_duplicate = "ignore"

    with pytest.raises(ConfigurationError, match=r"option on_duplicate .* got 'ignore'"):
        app.task(base=Sloppy, shared=False, lazy=False)(noop)
