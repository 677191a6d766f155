"""The ``redislock_beat_*`` settings, read and checked when a beat starts.

==============================  ======================================================
``redislock_beat_scheduler``    the scheduler whose sends are guarded: an import path
                                (``module:Class``) or a class; default
                                ``celery.beat:PersistentScheduler``
``redislock_beat_lease``        seconds of the leader lease, renewed in the background
                                (10): a dead or cut-off leader's successor starts
                                sending within about this long
``redislock_beat_group``        name of the set of beats of which one leads
                                (``"default"``): beats of different deployments on
                                one Redis use different names
``redislock_beat_catch_up``     seconds back a new leader sends the slots that came
                                due and were not sent (300); older ones are logged
                                as missed. 0: only the latest missed one (Celery's
                                own catch-up)
==============================  ======================================================

The key prefix is ``redislock_prefix``; the Redis is the lock Redis (``redislock_url``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from celery import Celery
from celery.beat import Scheduler
from celery.utils.imports import symbol_by_name

from ...core.keys import DEFAULT_PREFIX
from ...core.validate import check_name
from ...errors import ConfigurationError
from ..config import check_prefix, check_ttl

__all__ = ["DEFAULT_CATCH_UP", "DEFAULT_LEASE", "DEFAULT_SCHEDULER", "BeatSettings"]

DEFAULT_SCHEDULER: Final = "celery.beat:PersistentScheduler"
DEFAULT_LEASE: Final = 10.0
DEFAULT_CATCH_UP: Final = 300.0


@dataclass(frozen=True)
class BeatSettings:
    """The checked ``redislock_beat_*`` settings of an app."""

    scheduler: type[Scheduler]
    lease: float
    group: str
    catch_up: float
    prefix: str

    @classmethod
    def from_app(cls, app: Celery) -> BeatSettings:
        """Read and check the settings; a bad value raises ConfigurationError naming it."""
        get = app.conf.get
        return cls(
            scheduler=inner_scheduler(get("redislock_beat_scheduler", DEFAULT_SCHEDULER)),
            lease=check_ttl(get("redislock_beat_lease", DEFAULT_LEASE), "redislock_beat_lease"),
            group=_check_group(get("redislock_beat_group", "default")),
            catch_up=_check_catch_up(get("redislock_beat_catch_up", DEFAULT_CATCH_UP)),
            prefix=check_prefix(get("redislock_prefix", DEFAULT_PREFIX), "redislock_prefix"),
        )


def inner_scheduler(value: object) -> type[Scheduler]:
    """The scheduler class ``value`` names (``module:Class`` or ``module.Class``)."""
    setting = "redislock_beat_scheduler"
    if isinstance(value, str) and value:
        try:
            value = symbol_by_name(value)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(f"{setting}: cannot import {value!r}: {exc}") from exc
    if not isinstance(value, type) or not issubclass(value, Scheduler):
        raise ConfigurationError(
            f"{setting} must name a celery.beat.Scheduler subclass, got {value!r}"
        )
    return value


def _check_group(value: object) -> str:
    return check_name(value, "redislock_beat_group")


def _check_catch_up(value: object) -> float:
    if value == 0 and not isinstance(value, bool):
        return 0.0
    return check_ttl(value, "redislock_beat_catch_up")
