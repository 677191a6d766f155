"""Typos are loud (#29 item 2): an option name close to one of ours raises, however set.

``concurency_key=`` silently made the pool per task; ``unique_onn=`` silently keyed on
all arguments. Every way of setting a task option is checked: the decorators,
``@app.task(base=RedisLockTask, ...)``, a subclass attribute, ``task_annotations`` and
``apply_async``'s per-call options. Celery's own names (every Task attribute, every
``apply_async`` option) never count. No Redis: the checks run before any I/O.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from celery import Celery, Task
from kombu import Producer

from celery_redislock import (
    ConfigurationError,
    RedisLockTask,
    SingletonTask,
    bounded_task,
    rate_limited_task,
    singleton_task,
)
from celery_redislock.celery import singleton
from celery_redislock.celery.options import OPTIONS
from celery_redislock.celery.singleton.percall import PER_CALL

TYPOS = [
    ("concurency_key", "concurrency_key", "stripe-api"),
    ("unique_onn", "unique_on", ["user_id"]),
    ("singelton_mode", "singleton_mode", "interval"),
    ("reschedule_countdwn", "reschedule_countdown", 3),
    ("concurrency_limt", "concurrency_limit", 3),
    ("on_duplicat", "on_duplicate", "raise"),
    ("uniqe_on", "unique_on", ["a"]),
]

# Every apply_async / send_task keyword Celery 5.6-5.7 and kombu document or accept.
CELERY_CALL_OPTIONS = [
    "countdown",
    "eta",
    "expires",
    "retry",
    "retry_policy",
    "queue",
    "exchange",
    "routing_key",
    "priority",
    "serializer",
    "compression",
    "headers",
    "link",
    "link_error",
    "shadow",
    "task_id",
    "producer",
    "add_to_parent",
    "publisher",
    "connection",
    "time_limit",
    "soft_time_limit",
    "ignore_result",
    "chain",
    "chord",
    "group_id",
    "group_index",
    "root_id",
    "parent_id",
    "reply_to",
    "correlation_id",
    "delivery_mode",
    "mandatory",
    "immediate",
    "content_type",
    "content_encoding",
    "stamped_headers",
    "stamps",
    "expiration",
    "exchange_type",
    "declare",
    "retries",
    "origin",
    "argsrepr",
    "kwargsrepr",
    "replaced_task_nesting",
    "taskset",
    "router",
    "route_name",
]


def _celery_names() -> list[str]:
    names = {n for n in dir(Task) if not n.startswith("_")} | set(CELERY_CALL_OPTIONS)
    for function in (Task.apply_async, Celery.send_task, Celery.task, Producer.publish):
        names |= set(inspect.signature(function).parameters) - {"self", "args", "kwargs"}
    return sorted(names - {*OPTIONS, *PER_CALL})


_ABSENT = object()


def _match(typo: str, meant: str) -> str:
    return f"{typo}.*{meant}"


# -- the close-match rule itself ----------------------------------------------------------


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_a_typo_resembles_the_option_it_was_meant_to_be(typo: str, meant: str, value: Any) -> None:
    assert singleton.percall.resembles(typo) == meant


@pytest.mark.parametrize("name", _celery_names())
def test_no_celery_name_is_a_typo(name: str) -> None:
    assert singleton.percall.resembles(name) is None


@pytest.mark.parametrize(
    "name", ["rate_limit", "acks_late", "queue", "user_id", "tenant", "lock", "retry_jitter"]
)
def test_unrelated_names_are_not_typos(name: str) -> None:
    assert singleton.percall.resembles(name) is None


# -- every way of setting an option -------------------------------------------------------


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_bounded_task_keyword(app: Celery, typo: str, meant: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=_match(typo, meant)):

        @bounded_task(app=app, shared=False, concurrency_limit=3, **{typo: value})
        def job() -> None: ...


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_singleton_task_keyword(app: Celery, typo: str, meant: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=_match(typo, meant)):

        @singleton_task(app=app, shared=False, **{typo: value})
        def job(user_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match=_match(typo, meant)):  # a shared task

        @singleton_task(**{typo: value})
        def shared(user_id: int) -> None: ...


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_app_task_with_our_base(app: Celery, typo: str, meant: str, value: Any) -> None:
    @app.task(base=RedisLockTask, shared=False, **{typo: value})
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match=_match(typo, meant)):
        job.name  # noqa: B018  # @app.task binds (and checks) on first use


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_subclass_attribute(app: Celery, typo: str, meant: str, value: Any) -> None:
    base = type("Base", (SingletonTask,), {typo: value})

    @app.task(base=base, shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match=_match(typo, meant)):
        job.name  # noqa: B018


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_task_annotations(app: Celery, typo: str, meant: str, value: Any) -> None:
    app.conf.task_annotations = {"*": {typo: value}}

    @app.task(base=RedisLockTask, name="annotated", shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match=_match(typo, meant)):
        job.name  # noqa: B018


@pytest.mark.parametrize(("typo", "meant", "value"), TYPOS)
def test_per_call_option(app: Celery, typo: str, meant: str, value: Any) -> None:
    @app.task(base=SingletonTask, shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match=_match(typo, meant)):
        job.apply_async(**{typo: value})
    with pytest.raises(ConfigurationError, match=_match(typo, meant)):
        job.s().set(**{typo: value}).delay()


# -- Celery's own names pass everywhere ---------------------------------------------------


@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")  # queue=, priority=
def test_every_celery_task_attribute_passes_as_a_subclass_attribute(app: Celery) -> None:
    # Re-assigning each of Celery's own attributes on a subclass is accepted. Read
    # statically: getattr(Task, "app") would bind Celery's Task class itself, and every
    # task class made afterwards would skip task_annotations (Celery binds once).
    attrs = {
        n: v
        for n in _celery_names()
        if (v := inspect.getattr_static(Task, n, _ABSENT)) is not _ABSENT
        and not callable(v)
        and not hasattr(v, "__get__")  # methods, properties, class properties
    }
    assert {"rate_limit", "acks_late", "max_retries", "serializer"} <= set(attrs)
    base = type("Base", (SingletonTask,), attrs | {"rate_limit": "10/s", "acks_late": True})

    @app.task(base=base, name="all_celery_attributes", shared=False)
    def job() -> None: ...

    assert job.name == "all_celery_attributes"


@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")  # queue=, priority=
def test_celery_decorator_keywords_pass(app: Celery) -> None:
    @bounded_task(
        app=app,
        shared=False,
        concurrency_limit=3,
        concurrency_key="partner-api",
        rate_limit="10/s",
        acks_late=True,
        queue="q",
        bind=True,
        max_retries=3,
        autoretry_for=(OSError,),
        retry_backoff=True,
        retry_jitter=False,
        time_limit=10,
        soft_time_limit=5,
        ignore_result=True,
        serializer="json",
        track_started=True,
        reject_on_worker_lost=True,
        default_retry_delay=1,
        typing=False,
        expires=60,
        priority=3,
    )
    def job(self: Any) -> None: ...

    assert job.concurrency_key == "partner-api"


def test_every_apply_async_option_passes_the_check(app: Celery) -> None:
    from celery_redislock.celery.singleton.percall import call_options

    @app.task(base=SingletonTask, shared=False)
    def job() -> None: ...

    call_options(job, dict.fromkeys(_celery_names(), 1))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("global_rate_limit", "1/s"),  # before: accepted, and ignored without a word
        ("global_rate_key", "crm-api"),  # the same
        ("concurrency_limit", 5),  # before: "(a typo of 'concurrency_limit'?)"
        ("unique_on", ["user_id"]),  # the same, of 'unique_on'
        ("singleton_mode", "interval"),
    ],
)
def test_a_task_option_given_per_call_is_refused_as_one(app: Celery, name: str, value: Any) -> None:
    """A new user's ``sync_order.apply_async(args, global_rate_limit="1/s")`` (#29): our
    task options are not per-call options; the error says so, not that it is a typo of
    itself, and a rate-limit option is not let through silently."""

    @rate_limited_task(app=app, global_rate_limit="5/s", shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        job.apply_async(**{name: value})
    message = str(refused.value)
    assert f"{name}={value!r} is a task option, not a per-call option" in message, message
    assert "a typo of" not in message, message
