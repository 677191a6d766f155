"""celery_redislock: singleton tasks and bounded concurrency for Celery, on Redis.

The core (:class:`RedisLock`, :class:`RedisSemaphore`, :class:`Lease`) needs only
redis-py. The Celery names are imported on first use, so ``import celery_redislock``
does not import Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import Lease, RedisLock, RedisRateLimiter, RedisSemaphore, RedlockLock
from .errors import (
    ConfigurationError,
    DuplicateTask,
    LockNotOwned,
    LockTimeout,
    NotReplicated,
    RateLimited,
    RedisLockError,
    RedlockUnavailable,
)

if TYPE_CHECKING:
    from .celery import (
        RedisLockTask,
        SingletonTask,
        bounded_task,
        rate_limited_task,
        singleton_task,
    )

__version__ = "0.1.0"

__all__ = [
    # core
    "Lease",
    "RedisLock",
    "RedisRateLimiter",
    "RedisSemaphore",
    "RedlockLock",
    # Celery
    "RedisLockTask",
    "SingletonTask",
    "bounded_task",
    "rate_limited_task",
    "singleton_task",
    # errors
    "ConfigurationError",
    "DuplicateTask",
    "LockNotOwned",
    "LockTimeout",
    "NotReplicated",
    "RateLimited",
    "RedisLockError",
    "RedlockUnavailable",
]

_CELERY_NAMES = frozenset(
    {"RedisLockTask", "SingletonTask", "bounded_task", "rate_limited_task", "singleton_task"}
)


def __getattr__(name: str) -> Any:
    # Celery glue is loaded lazily so the core stays importable without Celery.
    if name in _CELERY_NAMES:
        from . import celery as _celery

        return getattr(_celery, name)
    raise AttributeError(f"module 'celery_redislock' has no attribute {name!r}")
