"""The exceptions celery_redislock raises; all derive from :class:`RedisLockError`.

Every exception is picklable from its ``args`` alone, so it crosses Celery's
result backend and process boundaries intact.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DuplicateTask",
    "LockNotOwned",
    "RedisLockError",
]


class RedisLockError(Exception):
    """Root of every error this package raises."""


class ConfigurationError(RedisLockError, ValueError):
    """An argument or option has a value that cannot work.

    The message names the argument and the value, e.g.
    ``ConfigurationError("ttl must be a finite number of seconds > 0, got -1")``.
    """


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


class DuplicateTask(RedisLockError):
    """A task with the same signature is already queued or running.

    ``task_id`` is the id of the existing copy, ``key`` the lock key it holds.
    """

    def __init__(self, message: str, task_id: str | None = None, key: str = "") -> None:
        super().__init__(message, task_id, key)
        self.task_id = task_id
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])
