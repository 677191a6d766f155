"""The bounded-concurrency options of a :class:`~..task.RedisLockTask`, read and validated.

Task options (class attributes, ``@app.task(...)`` keywords or ``task_annotations``;
``None`` means "the app's setting"):

========================== ==========================================================
``concurrency_limit``      int >= 1: at most this many runs of the pool at once,
                           across all workers (None: not bounded)
``concurrency_key``        the pool: None (the task's name), a string naming a pool
                           shared by several task types (``"stripe-api"``), or a
                           callable ``key(*args, **kwargs) -> str`` of the task's own
                           arguments (per-tenant pools)
``concurrency_countdown``  seconds before a run refused a permit is tried again
``concurrency_jitter``     up to this many seconds more, at random, so re-scheduled
                           runs do not come back all at once
``concurrency_wait``       seconds a refused run first waits in place for a permit
                           (blocking its worker slot) before it is re-scheduled
``concurrency_waiters``    at most this many runs of a pool wait in place at once,
                           across all workers (None: as many as the limit); the
                           others are parked (or re-scheduled) at once
``concurrency_standby``    opt-in: parked runs published ahead to wait in place for
                           the next permit, so a release hands it over with no
                           broker round trip, at the cost of that many worker slots
                           while a backlog lasts (0, the default: none)
``concurrency_park``       True (default): a refused run is parked in the pool's
                           FIFO queue in Redis and published again by the release
                           that frees its permit; False: it is re-published with
                           ``concurrency_countdown`` plus jitter (polling)
========================== ==========================================================

Settings (``app.conf``; read when used, so a change counts from the next run on):

=================================== =================================================
``redislock_concurrency_limits``    ``{pool name: limit}``: overrides the limit of
                                    those pools (see below)
``redislock_concurrency_countdown`` default ``concurrency_countdown``
``redislock_concurrency_jitter``    default ``concurrency_jitter``
``redislock_concurrency_wait``      default ``concurrency_wait``
``redislock_concurrency_waiters``   default ``concurrency_waiters``
``redislock_concurrency_park``      default ``concurrency_park``
``redislock_concurrency_standby``   default ``concurrency_standby``
=================================== =================================================

**Which limit applies.** ``redislock_concurrency_limits[pool]`` when the pool is
listed there, else the task's ``concurrency_limit``. A pool is only bounded when the
task has a ``concurrency_limit`` (the map changes numbers; it never bounds a task that
is not). A changed limit never revokes running tasks: a lowered one makes new runs
wait until fewer than the new limit hold permits (see
:class:`~celery_redislock.core.RedisSemaphore`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from ...errors import ConfigurationError
from ..config import task_option
from ..execution import AnyTask
from .settings import DEFAULT_COUNTDOWN, DEFAULT_JITTER, DEFAULT_STANDBY, DEFAULT_WAIT
from .settings import check_flag as _flag
from .settings import check_limit as _limit
from .settings import check_seconds as _seconds
from .settings import settings_of as _settings_of

__all__ = [
    "OPTIONS",
    "BoundedOptions",
    "PoolKey",
    "check_bounded_options",
    "resolve_bounded",
]

OPTIONS: Final = (
    "concurrency_limit",
    "concurrency_key",
    "concurrency_countdown",
    "concurrency_jitter",
    "concurrency_wait",
    "concurrency_waiters",
    "concurrency_park",
    "concurrency_standby",
)
"""The task options of bounded concurrency."""

PoolKey: TypeAlias = "str | Callable[..., str] | None"
"""A ``concurrency_key``: a pool name, a callable returning one, or None."""


@dataclass(frozen=True)
class BoundedOptions:
    """The validated bounded-concurrency options of one task, with the app's defaults."""

    limit: int | None
    key: PoolKey
    countdown: float
    jitter: float
    wait: float
    waiters: int | None
    limits: Mapping[str, int] = field(default_factory=dict)
    park: bool = True
    standby: int = DEFAULT_STANDBY

    def check_call(self, task: AnyTask, args: Any, kwargs: Any) -> None:
        """At ``delay()``: a callable ``concurrency_key`` that cannot take this call's
        arguments fails here, naming the option and the task -- not as a bare
        ``TypeError`` in the worker, where the run could only fail."""
        key = self.key
        if key is None or isinstance(key, str):
            return
        signature = _signature(key)
        if signature is None:
            return
        try:
            signature.bind(*(args or ()), **(kwargs or {}))
        except TypeError as exc:
            raise ConfigurationError(
                f"task {task.name!r}: option concurrency_key {key!r} cannot take the "
                f"task's arguments ({exc})"
            ) from None

    @property
    def enabled(self) -> bool:
        """True when the task's runs need a permit (it has a ``concurrency_limit``)."""
        return self.limit is not None

    def pool(self, task: AnyTask, args: Any, kwargs: Any) -> str:
        """The pool (semaphore name) of a call with the arguments the worker received."""
        key = self.key
        if key is None:
            return str(task.name)
        if isinstance(key, str):
            return key
        name = key(*(args or ()), **(kwargs or {}))
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"task {task.name!r}: concurrency_key {key!r} must return a non-empty "
                f"string (the pool's name), got {name!r}"
            )
        return name

    def limit_of(self, pool: str) -> int:
        """The limit in force for ``pool``: the setting's, else the task's."""
        limit = self.limits.get(pool, self.limit)
        assert limit is not None, "limit_of() is only used for bounded tasks"
        return limit

    def waiters_of(self, limit: int) -> int:
        """How many runs of a pool of ``limit`` may wait in place at once."""
        return limit if self.waiters is None else self.waiters


@functools.lru_cache(maxsize=256)
def _signature(key: Callable[..., str]) -> inspect.Signature | None:
    """The call signature of a ``concurrency_key`` callable (None: not inspectable)."""
    try:
        return inspect.signature(key)
    except (TypeError, ValueError):
        return None


def _name(task: object) -> str:
    return str(getattr(task, "name", None) or getattr(task, "__name__", "?"))


def _task_level(task: object) -> dict[str, Any]:
    """The options as set on the task, validated; None stays None (use the app's)."""
    where = f"task {_name(task)!r}: option"
    raw = {name: task_option(task, name) for name in OPTIONS}
    values: dict[str, Any] = dict(raw)
    if raw["concurrency_limit"] is not None:
        values["concurrency_limit"] = _limit(raw["concurrency_limit"], f"{where} concurrency_limit")
    key = raw["concurrency_key"]
    if key is not None and not callable(key) and not (isinstance(key, str) and key):
        raise ConfigurationError(
            f"{where} concurrency_key must be a pool name (a non-empty string), a callable "
            f"key(*args, **kwargs) -> str, or None, got {key!r}"
        )
    if key is not None and raw["concurrency_limit"] is None:
        raise ConfigurationError(
            f"{where} concurrency_key={key!r} needs concurrency_limit (an int >= 1), got None"
        )
    for name, zero in (
        ("concurrency_countdown", False),
        ("concurrency_jitter", True),
        ("concurrency_wait", True),
    ):
        if raw[name] is not None:
            values[name] = _seconds(raw[name], f"{where} {name}", zero=zero)
    if raw["concurrency_standby"] is not None:
        values["concurrency_standby"] = _limit(
            raw["concurrency_standby"], f"{where} concurrency_standby", least=0
        )
    if raw["concurrency_park"] is not None:
        values["concurrency_park"] = _flag(raw["concurrency_park"], f"{where} concurrency_park")
    if raw["concurrency_waiters"] is not None:
        values["concurrency_waiters"] = _limit(
            raw["concurrency_waiters"], f"{where} concurrency_waiters", least=0
        )
    return values


def check_bounded_options(task: object) -> None:
    """Validate the bounded-concurrency options set on a task; raise if one is bad."""
    _task_level(task)


_UNBOUNDED: Final = BoundedOptions(
    limit=None,
    key=None,
    countdown=DEFAULT_COUNTDOWN,
    jitter=DEFAULT_JITTER,
    wait=DEFAULT_WAIT,
    waiters=None,
)


def resolve_bounded(task: AnyTask) -> BoundedOptions:
    """The task's bounded-concurrency options: its own, else the app's settings.

    A task that sets neither ``concurrency_limit`` nor ``concurrency_key`` takes no
    permit: its other options and the ``redislock_concurrency_*`` settings are not read
    (they are checked where a bounded task reads them, and when a task is bound). Called
    by :func:`celery_redislock.celery.options.options_of` only, which keeps the result.
    """
    if (
        task_option(task, "concurrency_limit") is None
        and task_option(task, "concurrency_key") is None
    ):
        return _UNBOUNDED
    settings = _settings_of(task.app)
    values = _task_level(task)

    def pick(name: str, default: float) -> float:
        value = values[name]
        return default if value is None else float(value)

    return BoundedOptions(
        limit=values["concurrency_limit"],
        key=values["concurrency_key"],
        countdown=pick("concurrency_countdown", settings.countdown),
        jitter=pick("concurrency_jitter", settings.jitter),
        wait=pick("concurrency_wait", settings.wait),
        waiters=(
            settings.waiters
            if values["concurrency_waiters"] is None
            else values["concurrency_waiters"]
        ),
        limits=settings.limits,
        park=settings.park if values["concurrency_park"] is None else values["concurrency_park"],
        standby=(
            (DEFAULT_STANDBY if settings.standby is None else settings.standby)
            if values["concurrency_standby"] is None
            else values["concurrency_standby"]
        ),
    )
