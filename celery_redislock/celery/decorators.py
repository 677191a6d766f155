"""``@singleton_task`` and ``@bounded_task``: ``shared_task`` / ``app.task`` with our base.

::

    @singleton_task
    def refresh(user_id): ...

    @singleton_task(unique_on=["user_id"], on_duplicate="raise", lock_ttl=10)
    def rebuild(user_id, force=False): ...

    @singleton_task(app=app, bind=True, singleton_mode="interval", singleton_interval=60)
    def sync(self): ...

    @bounded_task(concurrency_limit=5, concurrency_key="stripe-api")
    def charge(customer_id, amount): ...

    @bounded_task(concurrency_limit=2, concurrency_key=lambda tenant, *a, **kw: f"t:{tenant}")
    def export(tenant, report): ...

Without ``app=`` the task is a ``shared_task`` (bound to every app, like Celery's);
with it, ``app.task``. Every other keyword is a task option (Celery's or ours).
Options of ours are checked at once, so a typo in a value fails at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, ParamSpec, TypeVar, overload

from celery import Celery, current_app, shared_task

from ..errors import ConfigurationError
from .bounded.options import OPTIONS as BOUNDED_OPTIONS
from .bounded.options import PoolKey
from .literals import OnDuplicate, OnRunningDuplicate, SingletonMode
from .options import check_class_options
from .ratelimit.options import check_rate_options
from .redlock import check_not_bounded
from .singleton.percall import check_unknown_options
from .task import RedisLockTask, SingletonTask

__all__ = ["bounded_task", "singleton_task"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

AnyRedisLockTask = RedisLockTask[..., Any]
"""A task of ours, whatever its parameters and result."""
_Decorate = Callable[[Callable[..., object]], AnyRedisLockTask]
"""What ``@app.task(**options)`` / ``@shared_task(**options)`` returns."""


def _decorator(
    app: Celery | None, options: dict[str, object], default_base: type[AnyRedisLockTask]
) -> _Decorate:
    if app is not None and not isinstance(app, Celery):
        raise ConfigurationError(f"app must be a Celery app or None, got {app!r}")
    base = options.setdefault("base", default_base)
    if not (isinstance(base, type) and issubclass(base, RedisLockTask)):
        raise ConfigurationError(
            f"base must be a subclass of celery_redislock.RedisLockTask, got {base!r}"
        )
    factory: Callable[..., _Decorate] = app.task if app is not None else shared_task

    def decorate(fun: Callable[..., object]) -> AnyRedisLockTask:
        # Checked once the function is known, so an error names the task as Celery
        # will (module + function), not "<task>".
        name = str(options.get("name") or _celery_name(app, fun))
        # A keyword that looks like ours but is none (``lock_tll=``) fails here.
        check_unknown_options(name, options, dir(base))
        # Checked as the task class would see them: these options over the base's.
        check_class_options(SimpleNamespace(**{**_class_options(base), **options, "name": name}))
        return factory(**options)(fun)

    return decorate


def _celery_name(app: Celery | None, fun: object) -> str:
    """The name Celery gives a task made of ``fun`` (``module.function``)."""
    module, name = getattr(fun, "__module__", None), getattr(fun, "__name__", None)
    if not module or not name:
        return "<task>"
    return str((app or current_app).gen_task_name(name, module))


def _class_options(base: type) -> dict[str, object]:
    names = (
        "singleton",
        "singleton_mode",
        "singleton_interval",
        "lock_ttl",
        "lock_queued_ttl",
        "on_duplicate",
        "on_running_duplicate",
        "reschedule_countdown",
        "lock_key",
        *BOUNDED_OPTIONS,
    )
    return {name: getattr(base, name, None) for name in names}


@overload
def singleton_task(fun: Callable[_P, _R], /) -> SingletonTask[_P, _R]: ...
@overload
def singleton_task(
    *,
    app: Celery | None = None,
    on_duplicate: OnDuplicate = ...,
    on_running_duplicate: OnRunningDuplicate = ...,
    singleton_mode: SingletonMode = ...,
    **options: object,
) -> Callable[[Callable[_P, _R]], SingletonTask[_P, _R]]: ...
def singleton_task(
    fun: Callable[..., object] | None = None, /, *, app: Celery | None = None, **options: object
) -> AnyRedisLockTask | _Decorate:
    """Declare a singleton task: ``shared_task`` (or ``app.task``) with
    ``base=SingletonTask``.

    Use bare (``@singleton_task``) or with options (``@singleton_task(lock_ttl=10)``);
    ``app=`` binds the task to that app only. A ``base=`` must be a subclass of
    :class:`RedisLockTask`; the lock is switched on for it.
    """
    options = dict(options)
    if not getattr(options.get("base", SingletonTask), "singleton", False):
        options.setdefault("singleton", True)
    decorator = _decorator(app, options, SingletonTask)
    return decorator(fun) if fun is not None else decorator


@overload
def bounded_task(
    fun: None = None,
    /,
    *,
    concurrency_limit: int,
    concurrency_key: PoolKey = None,
    app: Celery | None = None,
    on_duplicate: OnDuplicate = ...,
    on_running_duplicate: OnRunningDuplicate = ...,
    singleton_mode: SingletonMode = ...,
    **options: object,
) -> Callable[[Callable[_P, _R]], RedisLockTask[_P, _R]]: ...
@overload
def bounded_task(
    fun: Callable[_P, _R],
    /,
    *,
    concurrency_limit: int,
    concurrency_key: PoolKey = None,
    app: Celery | None = None,
    on_duplicate: OnDuplicate = ...,
    on_running_duplicate: OnRunningDuplicate = ...,
    singleton_mode: SingletonMode = ...,
    **options: object,
) -> RedisLockTask[_P, _R]: ...
def bounded_task(
    fun: Callable[..., object] | None = None,
    /,
    *,
    concurrency_limit: object = None,  # the overloads say int; checked with the options
    concurrency_key: PoolKey = None,
    app: Celery | None = None,
    **options: object,
) -> AnyRedisLockTask | _Decorate:
    """Declare a task whose concurrent runs across all workers never exceed a limit:
    ``shared_task`` (or ``app.task``) with ``base=RedisLockTask``.

    ``concurrency_limit`` (required, an int >= 1) caps the runs of the pool at once;
    ``concurrency_key`` names the pool: None (the task's name), a string shared by
    several tasks (``"stripe-api"``), or a callable ``key(*args, **kwargs) -> str`` of
    the task's arguments (one pool per tenant). ``app=`` binds the task to that app
    only. Any other keyword is a task option, Celery's or ours (``base=SingletonTask``
    or ``singleton=True`` for one run per signature as well)::

        @bounded_task(concurrency_limit=5, concurrency_key="stripe-api")
        def charge(customer_id, amount): ...
    """
    if concurrency_limit is None:
        raise ConfigurationError(
            "bounded_task needs concurrency_limit (an int >= 1), e.g. "
            "@bounded_task(concurrency_limit=3), got None"
        )
    options = {
        **options,
        "concurrency_limit": concurrency_limit,
        "concurrency_key": concurrency_key,
    }
    decorator = _decorator(app, options, RedisLockTask)
    if app is not None:  # a shared task is checked when an app binds it
        check_not_bounded(app, options.get("name") or "bounded_task", concurrency_limit)
    return decorator(fun) if fun is not None else decorator


@overload
def rate_limited_task(
    fun: None = None,
    /,
    *,
    global_rate_limit: str | Sequence[str],
    global_rate_key: PoolKey = None,
    app: Celery | None = None,
    **options: object,
) -> Callable[[Callable[_P, _R]], RedisLockTask[_P, _R]]: ...
@overload
def rate_limited_task(
    fun: Callable[_P, _R],
    /,
    *,
    global_rate_limit: str | Sequence[str],
    global_rate_key: PoolKey = None,
    app: Celery | None = None,
    **options: object,
) -> RedisLockTask[_P, _R]: ...
def rate_limited_task(
    fun: Callable[..., object] | None = None,
    /,
    *,
    global_rate_limit: object = None,  # the overloads say str | Sequence[str]; checked here
    global_rate_key: PoolKey = None,
    app: Celery | None = None,
    **options: object,
) -> AnyRedisLockTask | _Decorate:
    """Declare a task whose runs across all workers stay under a rate (issue #25):
    ``shared_task`` (or ``app.task``) with ``base=RedisLockTask``.

    ``global_rate_limit`` (required): ``"N/period"`` (``"10/s"``, ``"500/m"``,
    ``"5/10s"``) or a list of them, all of which must admit a run;
    ``global_rate_key`` names the limiter: None (the task's name), a string shared by
    several tasks (``"openai"``), or a callable ``key(*args, **kwargs) -> str`` of the
    task's arguments (one limiter per tenant). Over the rate a run is parked in Redis
    and started at its admission time (no retry, no worker process held). ``app=``
    binds the task to that app only. Any other keyword is a task option, Celery's or
    ours (``concurrency_limit=5``, ``singleton=True``)::

        @rate_limited_task(global_rate_limit="10/s", global_rate_key="openai")
        def summarize(doc_id): ...
    """
    if global_rate_limit is None:
        raise ConfigurationError(
            "rate_limited_task needs global_rate_limit (a rate 'N/period' or a list of "
            "them), e.g. @rate_limited_task(global_rate_limit='10/s'), got None"
        )
    options = {
        **options,
        "global_rate_limit": global_rate_limit,
        "global_rate_key": global_rate_key,
    }
    decorator = _decorator(app, options, RedisLockTask)

    def decorate(task_fun: Callable[..., object]) -> AnyRedisLockTask:
        # Once the function is known, so that an error names the task (as Celery
        # names it), as the other options' errors do.
        name = str(options.get("name") or _celery_name(app, task_fun))
        check_rate_options(
            SimpleNamespace(
                name=name, global_rate_limit=global_rate_limit, global_rate_key=global_rate_key
            )
        )
        return decorator(task_fun)

    return decorate(fun) if fun is not None else decorate
