"""The options of a rate-limited task: ``global_rate_limit`` and ``global_rate_key``.

Read from the task (class attributes, ``@app.task(...)`` options, ``task_annotations``)
when a run needs them; each is checked, and a bad value is a ``ConfigurationError``
naming the option and the value: when the task is defined (:func:`check_rate_options`)
and again when it runs.

May import the core and the shared glue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ...core.ratelimit_rates import parse_rates
from ...errors import ConfigurationError
from ..execution import AnyTask

__all__ = ["OPTIONS", "RateOptions", "check_rate_options", "rate_options"]

OPTIONS: Final = ("global_rate_limit", "global_rate_key")
"""The task options of this feature."""

PoolKey = str | Callable[..., Any] | None


@dataclass(frozen=True)
class RateOptions:
    """A task's rate limit: ``rates`` (the rate strings; empty: not rate limited) and
    ``key`` (None: one limiter per task name; a pool name shared by several tasks; or
    a callable of the task's arguments returning the pool's name)."""

    rates: tuple[str, ...]
    key: PoolKey

    @property
    def enabled(self) -> bool:
        """True when the task is rate limited."""
        return bool(self.rates)

    def pool(self, task: AnyTask, args: Any, kwargs: Any) -> str:
        """The limiter's name for a run with these arguments."""
        if self.key is None:
            return str(task.name)
        if isinstance(self.key, str):
            return self.key
        name = self.key(*(args or ()), **(kwargs or {}))
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"global_rate_key of {task.name} must return a non-empty str, got {name!r}"
            )
        return name


def rate_options(task: object) -> RateOptions:
    """The checked rate options of ``task`` (a task or its class)."""
    raw = getattr(task, "global_rate_limit", None)
    key = getattr(task, "global_rate_key", None)
    if raw is None:
        return RateOptions((), None)
    try:
        rates = parse_rates(raw, "global_rate_limit")
    except ConfigurationError as exc:  # which task's, as the other options' errors say
        raise ConfigurationError(f"{_where(task)} {exc}") from None
    if key is not None and not callable(key) and (not isinstance(key, str) or not key):
        raise ConfigurationError(
            f"{_where(task)} global_rate_key must be a non-empty str (a pool name) or a "
            f"callable of the task's arguments, got {key!r}"
        )
    return RateOptions(tuple(rate.text for rate in rates), key)


def _where(task: object) -> str:
    name = getattr(task, "name", None) or getattr(task, "__name__", "?")
    return f"task {str(name)!r}: option"


def check_rate_options(task: object) -> None:
    """Raise ``ConfigurationError`` for a bad ``global_rate_limit``/``global_rate_key``."""
    rate_options(task)
