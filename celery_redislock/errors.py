"""The exceptions celery_redislock raises; all derive from :class:`RedisLockError`.

Every exception is picklable from its ``args`` alone, so it crosses Celery's
result backend and process boundaries intact.
"""

from __future__ import annotations

import redis

__all__ = [
    "ConfigurationError",
    "DuplicateTask",
    "LockNotOwned",
    "LockTimeout",
    "NotReplicated",
    "RateLimited",
    "RedisLockError",
    "RedisRestarting",
    "RedlockUnavailable",
    "RedisUnavailable",
]


class RedisLockError(Exception):
    """Root of every error this package raises."""


class ConfigurationError(RedisLockError, ValueError):
    """An argument or option has a value that cannot work.

    The message names the argument and the value, e.g.
    ``ConfigurationError("ttl must be a finite number of seconds > 0, got -1")``.
    """


class RedlockUnavailable(RedisLockError):
    """Fewer than a majority of a Redlock's masters answered: the lock can be neither
    granted nor refused. The message names each master that failed and its error."""


class LockNotOwned(RedisLockError):
    """A lease is no longer ours: it expired, was released, or was taken over.

    ``name`` is the lock or semaphore name and ``token`` the lost lease's token.
    """

    def __init__(self, message: str, name: str = "", token: str = "") -> None:
        super().__init__(message, name, token)
        self.name = name
        self.token = token

    def __str__(self) -> str:
        return str(self.args[0])


class LockTimeout(RedisLockError, TimeoutError):
    """``hold()`` was not granted the lock or a permit in time.

    Raised at once by ``hold(blocking=False)`` (or ``timeout=0``) when it is held
    elsewhere, else when ``timeout`` seconds passed. ``name`` is the lock or semaphore
    name, ``timeout`` the seconds waited (None: did not wait), ``holder`` the owner id
    of the lease that held it when that is known (None otherwise). Also a builtin
    ``TimeoutError``, so ``except TimeoutError`` catches it too.
    """

    def __init__(
        self,
        message: str,
        name: str = "",
        timeout: float | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(message, name, timeout, holder)
        self.name = name
        self.timeout = timeout
        self.holder = holder

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateTask(RedisLockError):
    """A task with the same signature is already queued or running.

    ``task_id`` is the id of the existing copy, ``key`` the lock key it holds, and
    ``ttl_left`` the seconds left on its lock when the duplicate was refused (None when
    unknown): what celery-once calls ``countdown``, the time after which a retry may
    succeed if the copy stopped renewing its lock. A copy that is still running renews
    its lock, so it may hold it for longer.
    """

    def __init__(
        self,
        message: str,
        task_id: str | None = None,
        key: str = "",
        ttl_left: float | None = None,
    ) -> None:
        super().__init__(message, task_id, key, ttl_left)
        self.task_id = task_id
        self.key = key
        self.ttl_left = ttl_left

    def __str__(self) -> str:
        return str(self.args[0])


class NotReplicated(RedisLockError):
    """A grant was not acknowledged by ``min_replicas`` replicas within
    ``replica_timeout`` (``WAIT``, or ``WAITAOF`` with ``wait_aof``).

    The lease was released again (best effort: a release never waits for replicas),
    so the caller holds nothing. ``name`` is the lock or semaphore name, ``wanted``
    the replicas asked for, ``acked`` how many acknowledged in time.
    """

    def __init__(self, message: str, name: str = "", wanted: int = 0, acked: int = 0) -> None:
        super().__init__(message, name, wanted, acked)
        self.name = name
        self.wanted = wanted
        self.acked = acked

    def __str__(self) -> str:
        return str(self.args[0])


class RedisRestarting(RedisLockError, redis.ConnectionError):
    """The lock Redis lost its data and is within its restart grace (see
    ``core/restart.py``): whether the lock is free cannot be told yet (a lease it
    forgot may still run). A ``redis.ConnectionError``: what retries an outage
    retries this; the grace ends within the lock's ``restart_grace``."""


class RedisUnavailable(RedisLockError):
    """A run could not reach the lock Redis when it started, after every attempt
    ``redislock_outage_attempts`` allows; the message names the setting and the
    last connection error (chained as ``__cause__``)."""


class RateLimited(RedisLockError):
    """A call was refused by the API it makes because of its rate (an HTTP 429):
    raise it from a rate-limited task's body, with the API's ``Retry-After`` in
    ``retry_after`` (seconds, None: unknown), to penalize the task's limiter for every
    worker and run the task again once admitted (issue #25). ``RedisRateLimiter.
    penalize(retry_after)`` is the same for code without Celery."""

    def __init__(self, message: str = "rate limited", retry_after: float | None = None) -> None:
        super().__init__(message, retry_after)
        self.retry_after = retry_after

    def __str__(self) -> str:
        return str(self.args[0])
