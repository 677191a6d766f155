"""Settings and task options: defaults, Celery namespaces, and errors naming key and value."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task

from celery_redislock.celery.config import (
    DEFAULT_LOCK_TTL,
    DEFAULT_QUEUED_TTL,
    ON_DUPLICATE,
    Settings,
    check_on_duplicate,
    check_prefix,
    check_ttl,
    task_option,
)
from celery_redislock.errors import ConfigurationError


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("config", set_as_current=False)
    yield app
    app.close()


def test_defaults(app: Celery) -> None:
    settings = Settings.from_app(app)
    assert settings == Settings()
    assert settings.prefix == "redislock"
    assert settings.lock_ttl == DEFAULT_LOCK_TTL == 30.0
    assert settings.queued_ttl == DEFAULT_QUEUED_TTL == 3600.0
    assert settings.on_duplicate == "existing"
    assert set(ON_DUPLICATE) == {"existing", "raise", "drop", "replace"}


def test_conf_update_after_tasks_are_defined_counts(app: Celery) -> None:
    assert Settings.from_app(app).lock_ttl == 30.0
    app.conf.update(redislock_lock_ttl=2.5, redislock_prefix="p", redislock_queued_ttl=60)
    app.conf.redislock_on_duplicate = "raise"
    assert Settings.from_app(app) == Settings("p", 2.5, 60.0, "raise")


def test_celery_namespace_reads_prefixed_upper_case_keys(app: Celery) -> None:
    class DjangoSettings:
        CELERY_REDISLOCK_URL = "redis://example:6379/3"
        CELERY_REDISLOCK_LOCK_TTL = 12
        CELERY_REDISLOCK_PREFIX = "django"
        CELERY_BROKER_URL = "amqp://guest@rabbit//"

    app.config_from_object(DjangoSettings, namespace="CELERY")
    assert app.conf.get("redislock_url") == "redis://example:6379/3"
    settings = Settings.from_app(app)
    assert (settings.lock_ttl, settings.prefix) == (12.0, "django")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("redislock_lock_ttl", -1, r"redislock_lock_ttl must be .* > 0, got -1"),
        ("redislock_lock_ttl", "30", r"redislock_lock_ttl must be .*, got '30' \(str\)"),
        ("redislock_queued_ttl", float("inf"), "redislock_queued_ttl must be a finite"),
        ("redislock_queued_ttl", True, r"redislock_queued_ttl .* got True"),
        ("redislock_prefix", "", "redislock_prefix must be a non-empty string, got ''"),
        ("redislock_prefix", "a{b}", "redislock_prefix must not contain .* got 'a{b}'"),
        ("redislock_prefix", 3, "redislock_prefix must be a non-empty string, got 3"),
        ("redislock_on_duplicate", "skip", "redislock_on_duplicate must be one of .* 'skip'"),
        ("redislock_on_duplicate", ["raise"], r"redislock_on_duplicate .* got \['raise'\]"),
    ],
)
def test_bad_settings_are_named(app: Celery, key: str, value: Any, message: str) -> None:
    app.conf[key] = value
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_app(app)


def test_checks_return_clean_values() -> None:
    assert check_ttl(1, "lock_ttl") == 1.0
    assert check_ttl(0.0004, "lock_ttl") == 0.001  # millisecond precision, at least 1 ms
    assert check_prefix("x:y") == "x:y"
    assert check_on_duplicate("drop") == "drop"
    with pytest.raises(ConfigurationError, match="on_duplicate must be one of"):
        check_on_duplicate(None)
    with pytest.raises(ValueError, match="lock_ttl"):  # ConfigurationError is a ValueError
        check_ttl(0, "lock_ttl")


def key_function(*args: Any) -> str:
    return "k"


def test_task_option_returns_functions_unbound(app: Celery) -> None:
    app.conf.task_annotations = {"config.annotated": {"concurrency_key": key_function}}

    @app.task(shared=False, lock_key=key_function, unique_on=["a"])
    def decorated(a: int) -> None: ...

    @app.task(shared=False, name="config.annotated")
    def annotated(a: int) -> None: ...

    class Base(Task[Any, Any]):
        lock_key = staticmethod(key_function)
        lock_ttl = 5.0

    @app.task(shared=False, base=Base)
    def subclassed(a: int) -> None: ...

    assert task_option(decorated, "lock_key") is key_function  # a proxy, until finalized
    assert task_option(decorated, "unique_on") == ["a"]
    assert task_option(app.tasks[annotated.name], "concurrency_key") is key_function
    assert task_option(subclassed, "lock_key") is key_function
    assert task_option(subclassed, "lock_ttl") == 5.0
    assert task_option(subclassed, "missing", "dflt") == "dflt"
    # Plain attribute access would have bound the function as a method:
    assert app.tasks[decorated.name].lock_key is not key_function  # type: ignore[attr-defined]


def test_messages_name_the_url_the_locks_default_to() -> None:
    """A new user's worker said "redislock_url (unset: the broker's or result backend's
    'redis://...')" (#29): it knows which, and with a Redis broker and a Redis backend
    on two servers the user should not have to guess which holds the locks."""
    from celery_redislock.celery.outage import lock_redis

    both = Celery("both", broker="redis://:pw@broker:6379/0", backend="redis://backend:6379/1")
    assert lock_redis(both) == "redislock_url (unset: the broker's 'redis://:**@broker:6379/0')"
    rabbit = Celery("rabbit", broker="amqp://guest@mq//", backend="redis://backend:6379/1")
    assert (
        lock_redis(rabbit) == "redislock_url (unset: the result backend's 'redis://backend:6379/1')"
    )
    both.conf.redislock_url = "redis://locks:6379/2"
    assert lock_redis(both) == "redislock_url='redis://locks:6379/2'"
