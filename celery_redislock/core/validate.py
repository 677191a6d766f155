"""Argument checks shared by the core primitives: fail at construction, name the value."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from redis import Redis
from redis.cluster import RedisCluster

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from .scripts import RedisClient

__all__ = [
    "MAX_SECONDS",
    "acquire_deadline",
    "capped_ttl_ms",
    "check_max_hold",
    "check_bool",
    "check_async_client",
    "check_client",
    "check_name",
    "check_positive_int",
    "ttl_to_ms",
]


MAX_SECONDS = 1_000_000_000
"""The longest TTL, timeout or interval accepted, in seconds (about 31.7 years).

The scripts compute expiries as the server's clock in ms plus the TTL, in Lua 5.1
numbers (doubles, exact below 2^53) written with ``%d`` (wrong from 2^63): past that
an expiry turns negative and ``PEXPIREAT`` deletes the key at once. 10^12 ms on top of
today's clock (1.8 * 10^12 ms) stays exact with room for renewals and additions."""


def ttl_to_ms(value: object, argument: str = "ttl") -> int:
    """Return ``value`` seconds as whole milliseconds (at least 1), or raise.

    Floats are allowed; anything that is not a finite number > 0 and at most
    :data:`MAX_SECONDS` is refused.
    """
    if (value.__class__ is float or value.__class__ is int) and 0 < value <= MAX_SECONDS:
        return max(1, round(value * 1000))  # the common case
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(
            f"{argument} must be a number of seconds > 0, got {value!r} ({type(value).__name__})"
        )
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise ConfigurationError(
            f"{argument} must be a finite number of seconds > 0, got {value!r}"
        )
    if value > MAX_SECONDS:
        raise ConfigurationError(f"{argument} must be at most {MAX_SECONDS} seconds, got {value!r}")
    return max(1, round(value * 1000))


def check_name(name: object, argument: str = "name") -> str:
    """Return ``name`` if it is a non-empty string, else raise."""
    if not isinstance(name, str):
        raise ConfigurationError(
            f"{argument} must be a non-empty string, got {name!r} ({type(name).__name__})"
        )
    if not name:
        raise ConfigurationError(f"{argument} must be a non-empty string, got {name!r}")
    return name


def check_positive_int(value: object, argument: str) -> int:
    """Return ``value`` if it is an int >= 1 (bool excluded), else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{argument} must be an int >= 1, got {value!r}")
    return value


def check_client(client: object, argument: str = "client") -> RedisClient:
    """Return ``client`` if it is a redis-py ``Redis`` or ``RedisCluster``, else raise."""
    if not isinstance(client, (Redis, RedisCluster)):
        raise ConfigurationError(
            f"{argument} must be a redis.Redis or redis.cluster.RedisCluster, "
            f"got {client!r} ({type(client).__name__})"
        )
    return client


def check_async_client(client: object, argument: str = "client") -> AsyncRedis | AsyncRedisCluster:
    """Return ``client`` if it is a ``redis.asyncio.Redis`` or ``RedisCluster``, else raise."""
    from redis.asyncio import Redis as AsyncRedis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    if not isinstance(client, (AsyncRedis, AsyncRedisCluster)):
        raise ConfigurationError(
            f"{argument} must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, "
            f"got {client!r} ({type(client).__name__})"
        )
    return client


def check_bool(value: object, argument: str) -> bool:
    """Return ``value`` if it is True or False, else raise."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{argument} must be True or False, got {value!r}")
    return value


def check_max_hold(max_hold: object) -> float | None:
    """``max_hold`` in seconds (millisecond precision), or None; else raise."""
    return None if max_hold is None else ttl_to_ms(max_hold, "max_hold") / 1000.0


def capped_ttl_ms(ttl_ms: int, max_hold: float | None) -> int:
    """A first lease time never longer than ``max_hold``."""
    return ttl_ms if max_hold is None else min(ttl_ms, round(max_hold * 1000))


def acquire_deadline(blocking: bool, timeout: object) -> float | None:
    """When a blocking acquire gives up: None to try once (``blocking=False`` or
    ``timeout=0``), ``math.inf`` to wait for ever, else a ``time.monotonic()``
    instant. A bad ``timeout`` raises."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or timeout < 0
        or MAX_SECONDS < timeout < math.inf
    ):
        raise ConfigurationError(
            f"timeout must be None or a number of seconds >= 0 (at most {MAX_SECONDS}, "
            f"or math.inf), got {timeout!r}"
        )
    if not blocking or timeout == 0:
        return None
    return math.inf if timeout is None else time.monotonic() + timeout
