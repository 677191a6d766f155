"""A run that cannot reach the lock Redis when it starts waits for it, in place.

When Redis is unreachable at ``before_start`` (stopped, restarting, a network cut),
failing the run would lose the task: its message is acknowledged already, and
``autoretry_for`` cannot help (the guards run outside the body). Re-publishing it
would not survive either when the broker is the same Redis (the publish fails too),
and a countdown message is exactly what kombu's Redis transport loses or crashes on
during an outage (see the README). So the run stays where it is: the guard that met
the error is tried again after a backoff (0.25 s doubling to 2 s), holds taken
before it are kept (renewed, or reported lost), up to ``redislock_outage_attempts``
attempts (60: over two minutes with redis-py's own retries); ``max_retries`` is not
spent. After the last attempt the run fails with :class:`~..errors.RedisUnavailable`
naming the setting. One WARNING when a run starts waiting, one INFO when it goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import redis

from ..errors import ConfigurationError, RedisUnavailable
from .execution import AnyTask, Guard, Hold, RunState

__all__ = ["DEFAULT_ATTEMPTS", "OUTAGE_ERRORS", "enter_guard", "outage_attempts"]

logger = logging.getLogger(__name__)

DEFAULT_ATTEMPTS: Final = 60
"""Attempts of a guard whose Redis is unreachable before the run fails."""

OUTAGE_ERRORS: Final = (redis.ConnectionError, redis.TimeoutError)
"""What an unreachable Redis raises (``BusyLoadingError`` while a restarted Redis
loads its data is a ``ConnectionError``)."""

_FIRST_DELAY: Final = 0.25
_MAX_DELAY: Final = 2.0


def outage_attempts(app: Any) -> int:
    """``redislock_outage_attempts``, checked: an int >= 1 (1: fail at once)."""
    value = app.conf.get("redislock_outage_attempts", DEFAULT_ATTEMPTS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"redislock_outage_attempts must be an int >= 1, got {value!r}")
    return value


def enter_guard(
    guard: Guard, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Hold | None:
    """``guard.enter(...)``, tried again while Redis is unreachable (see the module)."""
    try:
        return guard.enter(task, run, args, kwargs)
    except OUTAGE_ERRORS as first:
        error: BaseException = first
    attempts, started = outage_attempts(task.app), time.monotonic()
    logger.warning(
        "celery_redislock: %s[%s] cannot reach the lock Redis (%s); waiting for "
        "it (up to %d attempts)",
        task.name,
        run.task_id,
        error,
        attempts,
    )
    delay = _FIRST_DELAY
    for attempt in range(2, attempts + 1):
        time.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY)
        try:
            hold = guard.enter(task, run, args, kwargs)
        except OUTAGE_ERRORS as exc:
            error = exc
            continue
        logger.info(
            "celery_redislock: %s[%s] reached the lock Redis again after %.1fs (attempt %d)",
            task.name,
            run.task_id,
            time.monotonic() - started,
            attempt,
        )
        return hold
    raise RedisUnavailable(
        f"task {task.name}[{run.task_id}]: the lock Redis was unreachable for {attempts} "
        f"attempts over {time.monotonic() - started:.0f}s ({type(error).__name__}: "
        f"{error}); raise redislock_outage_attempts to wait longer"
    ) from error
