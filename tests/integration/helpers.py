"""Helpers for the integration tests (import them; fixtures are in conftest)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from celery_redislock import RedisLock
from celery_redislock.core.info import PrimitiveInfo

from .workers import RESULTS_DB, db_url

__all__ = ["lock_info", "results_url", "wait_until"]


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


def lock_info(locks: redis.Redis, key: str) -> PrimitiveInfo:
    """The singleton lock ``key``'s state (default prefix)."""
    return RedisLock(locks, key).info()


def results_url(redis_url: str) -> str:
    """URL of the results database."""
    return db_url(redis_url, RESULTS_DB)
