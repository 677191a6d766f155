"""``@singleton_task`` and ``@bounded_task``: ``shared_task`` / ``app.task`` with our base.

::

    @singleton_task
    def refresh(user_id): ...

    @singleton_task(unique_on=["user_id"], on_duplicate="raise", lock_ttl=10)
    def rebuild(user_id, force=False): ...

    @singleton_task(app=app, bind=True, singleton_mode="interval", singleton_interval=60)
    def sync(self): ...

Without ``app=`` the task is a ``shared_task`` (bound to every app, like Celery's);
with it, ``app.task``. Every other keyword is a task option (Celery's or ours).
Options of ours are checked at once, so a typo in a value fails at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar, overload

from celery import Celery, shared_task
from typing_extensions import ParamSpec

from ..errors import ConfigurationError, RedisLockError
from .options import check_class_options
from .task import RedisLockTask, SingletonTask

__all__ = ["bounded_task", "singleton_task"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _decorator(app: Celery | None, options: dict[str, Any]) -> Callable[[Any], Any]:
    if app is not None and not isinstance(app, Celery):
        raise ConfigurationError(f"app must be a Celery app or None, got {app!r}")
    base = options.setdefault("base", SingletonTask)
    if not (isinstance(base, type) and issubclass(base, RedisLockTask)):
        raise ConfigurationError(
            f"base must be a subclass of celery_redislock.RedisLockTask, got {base!r}"
        )
    if not base.singleton:
        options.setdefault("singleton", True)
    # Checked as the task class would see them: these options over the base's.
    check_class_options(SimpleNamespace(**{"name": "<task>", **_class_options(base),
                                           **options}))  # fmt: skip
    factory: Callable[..., Callable[[Any], Any]] = (
        app.task if app is not None else shared_task
    )
    return factory(**options)


def _class_options(base: type) -> dict[str, Any]:
    names = ("singleton", "singleton_mode", "singleton_interval", "lock_ttl",
             "lock_queued_ttl", "on_duplicate", "on_running_duplicate",
             "reschedule_countdown", "lock_key")  # fmt: skip
    return {name: getattr(base, name, None) for name in names}


@overload
def singleton_task(fun: Callable[_P, _R], /) -> SingletonTask[_P, _R]: ...
@overload
def singleton_task(
    *, app: Celery | None = None, **options: Any
) -> Callable[[Callable[_P, _R]], SingletonTask[_P, _R]]: ...
def singleton_task(
    fun: Callable[..., Any] | None = None, /, *, app: Celery | None = None, **options: Any
) -> Any:
    """Declare a singleton task: ``shared_task`` (or ``app.task``) with
    ``base=SingletonTask``.

    Use bare (``@singleton_task``) or with options (``@singleton_task(lock_ttl=10)``);
    ``app=`` binds the task to that app only. A ``base=`` must be a subclass of
    :class:`RedisLockTask`; the lock is switched on for it.
    """
    decorator = _decorator(app, dict(options))
    return decorator(fun) if fun is not None else decorator


def bounded_task(*args: Any, **options: Any) -> Any:
    """Declare a task whose concurrent runs across all workers never exceed a limit.

    Not available in this version: it arrives with bounded concurrency
    (``concurrency_limit``); calling it raises :class:`RedisLockError`.
    """
    raise RedisLockError(
        "bounded_task is not available yet: it arrives with bounded concurrency "
        "(the concurrency_limit option of RedisLockTask)"
    )
