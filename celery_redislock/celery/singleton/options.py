"""The singleton options of a :class:`~..task.RedisLockTask`, read and validated.

Every option is a class attribute of the task: set it with ``@app.task(base=...,
option=value)``, by subclassing, or through ``task_annotations``. ``None`` means "use
the app's setting" (see :mod:`..config`). Options are read when used, not copied at
definition time, so annotations and ``app.conf.update`` made later still count; a bad
value raises :class:`~celery_redislock.errors.ConfigurationError` naming the task, the
option and the value (already when the task is bound to its app, for values set on
the class).

======================== ============================================================
``singleton``            take the per-signature lock at all (``SingletonTask``: True)
``unique_on``            argument names making the signature (default: all)
``lock_key``             callable ``key(*args, **kwargs) -> str``: the whole key
``lock_ttl``             seconds: lease of a running task, renewed while it runs
``lock_queued_ttl``      seconds: lease of a queued task (countdown/ETA added on top)
``on_duplicate``         ``"existing"``, ``"raise"``, ``"drop"`` or ``"replace"``
``on_running_duplicate`` ``"skip"`` or ``"reschedule"``
``reschedule_countdown`` seconds before a rescheduled runtime duplicate runs again
``singleton_mode``       ``"until_done"``, ``"while_running"``, ``"until_started"``,
                         ``"interval"``, ``"until_and_while_executing"``
``singleton_interval``   seconds the lock stays held after a run (mode ``interval``)
======================== ============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ...core import RedisLock, RedlockLock
from ...errors import ConfigurationError
from ..config import Settings, check_on_duplicate, check_ttl, task_option
from ..execution import AnyTask
from ..literals import MODES as _MODES
from ..literals import ON_RUNNING_DUPLICATE as _ON_RUNNING_DUPLICATE
from ..upstream import pydantic_dumper
from .binding import check_unique_on

__all__ = [
    "MODES",
    "ON_RUNNING_DUPLICATE",
    "OPTIONS",
    "SingletonOptions",
    "check_singleton_options",
    "resolve_singleton",
]

MODES: Final = _MODES
"""How long a singleton lock is held (see :data:`..literals.MODES`)."""

ON_RUNNING_DUPLICATE: Final = _ON_RUNNING_DUPLICATE
"""What a worker does with a copy that starts while another copy holds the lock."""

DEFAULT_RESCHEDULE_COUNTDOWN: Final = 5.0
"""Seconds before a rescheduled runtime duplicate is tried again."""


@dataclass(frozen=True)
class SingletonOptions:
    """The validated singleton options of one task, with the app's defaults applied."""

    enabled: bool
    mode: str
    lock_ttl: float
    queued_ttl: float
    on_duplicate: str
    on_running_duplicate: str
    reschedule_countdown: float
    interval: float | None
    prefix: str
    unique_on: tuple[str, ...] | None = None
    """The argument names making the key, sorted (None: all of them)."""
    lock_key: Callable[..., str] | None = None
    """The task's ``lock_key`` callable (it then makes the whole key)."""
    dump_models: Callable[[Any, Any], tuple[Any, Any]] | None = None
    """A ``pydantic=True`` task's dumper of its arguments' models, which
    ``apply_async`` applies before serializing (see :mod:`..upstream`); None."""
    replicas: Mapping[str, Any] = field(default_factory=dict)
    """The replica acknowledgement terms of its locks and permits (``min_replicas``,
    ``replica_timeout``, ``wait_aof``: :func:`..client.replica_options`; empty: none)."""
    redlock_max_ttl: float | None = None
    """Under Redlock (``redislock_urls``): the longest lease its locks take (see
    :mod:`..redlock`); None: locks on the app's Redis."""
    restart_grace: float | bool = False
    """``redislock_restart_grace`` (see :func:`..config.restart_grace`)."""
    locks: dict[str, tuple[int, RedisLock | RedlockLock]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Lock objects by key, each with the process that made it (see
    :func:`.leases.lock_for`); these options are replaced whenever the task's options
    or the app's settings change, its Redis client's included."""

    @property
    def lock_at_enqueue(self) -> bool:
        """True when ``apply_async`` takes the lock (every mode but ``while_running``)."""
        return self.mode != "while_running"

    @property
    def lock_while_running(self) -> bool:
        """True when the run holds the lock (every mode but ``until_started``)."""
        return self.mode != "until_started"


def _name(task: object) -> str:
    return str(getattr(task, "name", None) or getattr(task, "__name__", "?"))


def _choice(task: object, option: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigurationError(
            f"task {_name(task)!r}: option {option} must be one of {choices}, got {value!r}"
        )
    return value


def _seconds(task: object, option: str, value: object) -> float:
    try:
        return check_ttl(value, option)
    except ConfigurationError as exc:
        raise ConfigurationError(f"task {_name(task)!r}: option {exc}") from None


def _flag(task: object, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"task {_name(task)!r}: option {option} must be True or False, got {value!r}"
        )
    return value


def _task_level(task: object) -> dict[str, Any]:
    """The options as set on the task, validated; None stays None (use the app's)."""
    get = task_option
    values: dict[str, Any] = {"singleton": _flag(task, "singleton", get(task, "singleton", False))}
    values["mode"] = _choice(
        task, "singleton_mode", get(task, "singleton_mode", "until_done"), MODES
    )
    for option in ("lock_ttl", "lock_queued_ttl", "singleton_interval"):
        raw = get(task, option)
        values[option] = None if raw is None else _seconds(task, option, raw)
    raw = get(task, "reschedule_countdown")
    values["reschedule_countdown"] = (
        DEFAULT_RESCHEDULE_COUNTDOWN if raw is None else _seconds(task, "reschedule_countdown", raw)
    )
    raw = get(task, "on_duplicate")
    if raw is not None:
        try:
            check_on_duplicate(raw, "on_duplicate")
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {_name(task)!r}: option {exc}") from None
    values["on_duplicate"] = raw
    values["on_running_duplicate"] = _choice(
        task,
        "on_running_duplicate",
        get(task, "on_running_duplicate", "skip"),
        ON_RUNNING_DUPLICATE,
    )
    if values["singleton_interval"] is not None and values["mode"] != "interval":
        raise ConfigurationError(
            f"task {_name(task)!r}: option singleton_interval="
            f"{values['singleton_interval']!r} needs singleton_mode='interval' (it would "
            f"be ignored), got singleton_mode={values['mode']!r}"
        )
    if values["mode"] == "interval" and values["singleton_interval"] is None:
        raise ConfigurationError(
            f"task {_name(task)!r}: singleton_mode='interval' needs option "
            "singleton_interval (seconds the lock stays held after a run), got None"
        )
    lock_key = get(task, "lock_key")
    if lock_key is not None and not callable(lock_key):
        raise ConfigurationError(
            f"task {_name(task)!r}: option lock_key must be callable, got {lock_key!r}"
        )
    return values


def check_singleton_options(task: object) -> None:
    """Validate the singleton options set on a task (class or instance); raise if one is bad."""
    _task_level(task)


OPTIONS: Final = (
    "singleton",
    "singleton_mode",
    "lock_ttl",
    "lock_queued_ttl",
    "singleton_interval",
    "reschedule_countdown",
    "on_duplicate",
    "on_running_duplicate",
    "lock_key",
    "unique_on",
)
"""The task options of singleton tasks."""


def resolve_singleton(task: AnyTask, settings: Settings) -> SingletonOptions:
    """The task's singleton options under ``settings``: its own, else the app's.

    Called by :func:`celery_redislock.celery.options.options_of` only, which keeps the
    result while neither the task's options nor the app's settings change.
    """
    values = _task_level(task)
    return SingletonOptions(
        enabled=values["singleton"],
        mode=values["mode"],
        lock_ttl=values["lock_ttl"] or settings.lock_ttl,
        queued_ttl=values["lock_queued_ttl"] or settings.queued_ttl,
        on_duplicate=values["on_duplicate"] or settings.on_duplicate,
        on_running_duplicate=values["on_running_duplicate"],
        reschedule_countdown=values["reschedule_countdown"],
        interval=values["singleton_interval"],
        prefix=settings.prefix,
        unique_on=check_unique_on(task),
        lock_key=task_option(task, "lock_key"),
        dump_models=pydantic_dumper(task),
    )
