"""The ``redislock_concurrency_*`` settings, their defaults and the checks of their values
(shared with the task options in :mod:`.options`).

Imports the shared glue's config and the core's parking default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from celery import Celery

from ...core.parking import TAKEN_MEMORY_MS
from ...errors import ConfigurationError
from ..config import check_ttl

__all__ = [
    "DEFAULT_COUNTDOWN",
    "DEFAULT_JITTER",
    "DEFAULT_KEEP",
    "DEFAULT_STANDBY",
    "DEFAULT_SWEEP_INTERVAL",
    "DEFAULT_WAIT",
    "SETTINGS",
    "Settings",
    "check_flag",
    "check_limit",
    "check_limits",
    "check_seconds",
    "park_keep",
    "settings_of",
    "sweep_interval",
    "taken_memory",
]

# The defaults come from benchmarks/bench_bounded.py (see the README). By default a
# refused run never holds its worker slot: it goes back to the queue at once, which
# leaves a permit idle while a re-sent message comes back (the countdown, plus ~5 ms
# of worker time per try): ~1.27x the unbounded time for 50 ms tasks. Waiting in
# place (concurrency_wait > 0) takes a freed permit at once (~1.03x), at the cost of
# blocking up to `concurrency_waiters` slots for that long: an opt-in trade.

DEFAULT_COUNTDOWN: Final = 0.2
"""Seconds before a run refused a permit is tried again (plus jitter). Short, so a
freed permit soon finds a taker; each re-schedule costs a publish and a delivery."""

DEFAULT_JITTER: Final = 0.3
"""Up to this many seconds are added at random to each re-schedule's countdown, so
re-scheduled runs come back spread out rather than all at once."""

DEFAULT_KEEP: Final = 86400.0
"""Seconds the parked runs of a pool are kept after the latest park (a day),
``redislock_park_keep``; the park journal keeps its copies as long."""

DEFAULT_STANDBY: Final = 0
"""Parked runs of a pool published ahead to wait in place for the next permit. 0: none
(a parked run holds no worker slot); see ``concurrency_standby``."""

DEFAULT_SWEEP_INTERVAL: Final = 1.0
"""Seconds between the parked-run sweeps of a worker (``redislock_park_sweep_interval``)."""

DEFAULT_WAIT: Final = 0.0
"""Seconds a refused run waits in place (if fewer than ``concurrency_waiters`` wait
already) before it is re-scheduled. 0: never; a worker slot is not blocked."""

SETTINGS: Final = (
    "redislock_concurrency_limits",
    "redislock_concurrency_countdown",
    "redislock_concurrency_jitter",
    "redislock_concurrency_wait",
    "redislock_concurrency_waiters",
    "redislock_concurrency_park",
    "redislock_concurrency_standby",
)
"""The settings of bounded concurrency."""


def check_limit(value: object, what: str, least: int = 1) -> int:
    """``value`` if it is an int >= ``least``, else ConfigurationError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigurationError(f"{what} must be an int >= {least}, got {value!r}")
    return value


def check_seconds(value: object, what: str, *, zero: bool) -> float:
    """``value`` as float seconds if > 0 (or 0 with ``zero``), else ConfigurationError."""
    if zero and isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    try:
        return check_ttl(value, what)
    except ConfigurationError:
        least = ">= 0" if zero else "> 0"
        raise ConfigurationError(
            f"{what} must be a number of seconds {least}, got {value!r}"
        ) from None


def check_limits(value: object, argument: str = "redislock_concurrency_limits") -> dict[str, int]:
    """Return ``value`` as ``{pool: limit}`` if it maps non-empty names to ints >= 1."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{argument} must be a dict {{pool name: limit}}, got {value!r}")
    limits: dict[str, int] = {}
    for pool, limit in value.items():
        if not isinstance(pool, str) or not pool:
            raise ConfigurationError(
                f"{argument}: pool names must be non-empty strings, got {pool!r}"
            )
        limits[pool] = check_limit(limit, f"{argument}[{pool!r}]")
    return limits


def check_flag(value: object, what: str) -> bool:
    """``value`` if it is True or False, else ConfigurationError naming ``what``."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """The app's ``redislock_concurrency_*`` settings, checked."""

    limits: Mapping[str, int]
    countdown: float
    jitter: float
    wait: float
    waiters: int | None
    park: bool
    standby: int | None


def settings_of(app: Celery) -> Settings:
    """Read and check the app's bounded-concurrency settings now."""
    get = app.conf.get
    return Settings(
        limits=check_limits(get("redislock_concurrency_limits")),
        countdown=check_seconds(
            get("redislock_concurrency_countdown", DEFAULT_COUNTDOWN),
            "redislock_concurrency_countdown",
            zero=False,
        ),
        jitter=check_seconds(
            get("redislock_concurrency_jitter", DEFAULT_JITTER),
            "redislock_concurrency_jitter",
            zero=True,
        ),
        wait=check_seconds(
            get("redislock_concurrency_wait", DEFAULT_WAIT),
            "redislock_concurrency_wait",
            zero=True,
        ),
        waiters=_waiters(get("redislock_concurrency_waiters")),
        park=check_flag(get("redislock_concurrency_park", True), "redislock_concurrency_park"),
        standby=_standby(get("redislock_concurrency_standby")),
    )


def park_keep(app: Celery) -> float:
    """``redislock_park_keep``, checked: seconds > 0 (default :data:`DEFAULT_KEEP`)."""
    value = app.conf.get("redislock_park_keep", DEFAULT_KEEP)
    return check_seconds(value, "redislock_park_keep", zero=False)


def taken_memory(app: Celery) -> float:
    """Seconds a consumed park token is remembered: twice the broker's redelivery delay,
    at least an hour (:data:`~celery_redislock.core.parking.TAKEN_MEMORY_MS`). A Redis
    (or SQS) broker hands an unacknowledged message out again after its
    ``visibility_timeout`` (``broker_transport_options``; kombu's default for Redis is
    an hour) plus a restore interval; a message parked or handed over at intake whose
    ack was lost (its worker main killed) must still find its token known then, so it
    is dropped instead of run again. AMQP redelivers at once: the hour does."""
    floor = TAKEN_MEMORY_MS / 1000
    options = app.conf.get("broker_transport_options") or {}
    value = options.get("visibility_timeout") if isinstance(options, Mapping) else None
    if value is None:
        url = app.conf.get("broker_url") or app.conf.get("broker_read_url") or ""
        scheme = str(url).split(":", 1)[0].lower() if isinstance(url, str) else ""
        value = floor if scheme in _REDIS_SCHEMES else 0.0  # kombu's Redis default: 1 h
    seconds = check_seconds(value, "broker_transport_options['visibility_timeout']", zero=True)
    return max(floor, 2 * seconds)


_REDIS_SCHEMES: Final = frozenset({"redis", "rediss", "sentinel", "redis+socket"})


def sweep_interval(app: Celery) -> float:
    """``redislock_park_sweep_interval``, checked: seconds > 0 (0 would spin)."""
    value = app.conf.get("redislock_park_sweep_interval", DEFAULT_SWEEP_INTERVAL)
    return check_seconds(value, "redislock_park_sweep_interval", zero=False)


def _standby(value: object) -> int | None:
    return None if value is None else check_limit(value, "redislock_concurrency_standby", least=0)


def _waiters(value: object) -> int | None:
    return None if value is None else check_limit(value, "redislock_concurrency_waiters", least=0)
