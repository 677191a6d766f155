"""Errors name what is wrong while the user can still act (issue 13, item 6)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, bounded_task, singleton_task
from celery_redislock.celery.bounded.guard import PermitHold
from celery_redislock.celery.execution import Hold
from celery_redislock.celery.singleton.guard import SingletonHold


class _OwnTasks(Celery):
    """An app whose tasks are its own: ``@app.task`` is ``shared=True`` by default, and a
    shared task joins every app finalized after it (a bounded one then breaks a later
    test's Redlock app, which refuses bounded tasks)."""

    def task(self, *args: Any, **options: Any) -> Any:
        options.setdefault("shared", False)
        return super().task(*args, **options)


@pytest.fixture
def app() -> Celery:
    app = _OwnTasks("edges", set_as_current=False, broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = False
    return app


def test_the_tasks_of_these_tests_join_no_later_app(app: Celery) -> None:
    @bounded_task(app=app, concurrency_limit=2)
    def capped() -> None: ...

    @singleton_task(app=app)
    def single() -> None: ...

    later = Celery("later", set_as_current=False)
    later.finalize()
    assert capped.name in app.tasks and single.name in app.tasks
    assert capped.name not in later.tasks and single.name not in later.tasks


def test_a_decoration_error_names_the_task_as_celery_will(app: Celery) -> None:
    with pytest.raises(ConfigurationError) as caught:

        @singleton_task(app=app, lock_ttl=-1)
        def refresh_user(user_id: int) -> None: ...

    # Before: "task '<task>'" unless name= was given.
    assert f"{__name__}.refresh_user" in str(caught.value)
    assert "lock_ttl" in str(caught.value) and "<task>" not in str(caught.value)


def test_singleton_interval_needs_the_interval_mode(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match=r"singleton_interval=60.0 needs singleton_mode"):

        @singleton_task(app=app, singleton_interval=60)
        def nightly() -> None: ...

    @singleton_task(app=app, singleton_mode="interval", singleton_interval=60)
    def nightly_ok() -> None: ...


def test_a_concurrency_key_that_cannot_take_the_arguments_fails_at_delay(app: Celery) -> None:
    def by_tenant(tenant: str) -> str:
        return f"tenant:{tenant}"

    @bounded_task(app=app, concurrency_limit=2, concurrency_key=by_tenant)
    def sync(tenant: str, full: bool = False) -> None: ...

    # Before: accepted here, then a raw TypeError in the worker.
    with pytest.raises(ConfigurationError, match=r"concurrency_key .* cannot take") as caught:
        sync.delay("acme", full=True)
    assert "test_errors_at_the_edges.sync" in str(caught.value)
    assert sync.delay("acme") is not None  # a call it can take is sent


def test_holds_and_leases_say_what_they_are() -> None:
    lease: Any = SimpleNamespace(fence=7)
    task: Any = SimpleNamespace(name="proj.tasks.refresh")
    options: Any = SimpleNamespace(mode="until_done")
    held = SingletonHold(task, "id-1", "redislock:lock:{k}", lease, options)
    assert repr(held) == "<SingletonHold 'redislock:lock:{k}' of proj.tasks.refresh[id-1] fence=7>"
    assert repr(PermitHold(task, "id-2", "pool", lease)) == "<PermitHold 'pool' of id-2>"
    assert "object at 0x" not in repr(Hold())
