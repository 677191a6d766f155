"""The ``redislock_*`` settings and task options, read lazily and validated.

Settings are read with ``app.conf.get`` when needed, never copied at import or bind
time: ``app.conf.update`` after the tasks are defined still counts, and keys with no
Celery default do not make ``Task.from_config`` raise. Through Celery's namespaces,
``config_from_object(obj, namespace="CELERY")`` reads ``CELERY_REDISLOCK_PREFIX`` as
``redislock_prefix``. The connection settings are read by :mod:`.client`.

==========================  ========================================================
``redislock_prefix``        first part of every key (default ``"redislock"``)
``redislock_lock_ttl``      lease of a running task, renewed while it runs (30 s)
``redislock_queued_ttl``    lease of a queued task, before it starts (3600 s)
``redislock_on_duplicate``  default ``on_duplicate`` of singleton tasks
==========================  ========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from celery import Celery
from celery.local import Proxy

from ..core.keys import DEFAULT_PREFIX
from ..core.restart import check_grace
from ..core.validate import check_name, ttl_to_ms
from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_LOCK_TTL",
    "DEFAULT_QUEUED_TTL",
    "ON_DUPLICATE",
    "SETTINGS_KEYS",
    "Settings",
    "check_on_duplicate",
    "check_prefix",
    "check_ttl",
    "restart_grace",
    "settings_for",
    "task_option",
]

DEFAULT_LOCK_TTL: Final = 30.0
"""Seconds: a killed worker's lock frees this soon; renewal keeps a live one held."""

DEFAULT_QUEUED_TTL: Final = 3600.0
"""Seconds a queued task's lease lasts (plus any countdown or ETA). Nothing renews a
message waiting in a queue, so this must outlast a busy backlog; it equals the Redis
transport's default ``visibility_timeout``, after which a waiting message would be
redelivered anyway. If it lapses the task still runs; only de-duplication weakens."""

ON_DUPLICATE: Final = ("existing", "raise", "drop", "replace")
"""What enqueueing a copy of a queued or running singleton task does: return the
existing ``AsyncResult``, raise ``DuplicateTask``, drop the new copy (logged and
signalled), or revoke the queued copy and enqueue the new one."""


@dataclass(frozen=True)
class Settings:
    """The validated ``redislock_*`` settings of one app (see :meth:`from_app`)."""

    prefix: str = DEFAULT_PREFIX
    lock_ttl: float = DEFAULT_LOCK_TTL
    queued_ttl: float = DEFAULT_QUEUED_TTL
    on_duplicate: str = "existing"

    @classmethod
    def from_app(cls, app: Celery) -> Settings:
        """Read and check the settings now; a bad value raises ConfigurationError."""
        get = app.conf.get
        return cls(
            prefix=check_prefix(get("redislock_prefix", DEFAULT_PREFIX), "redislock_prefix"),
            lock_ttl=check_ttl(get("redislock_lock_ttl", DEFAULT_LOCK_TTL), "redislock_lock_ttl"),
            queued_ttl=check_ttl(
                get("redislock_queued_ttl", DEFAULT_QUEUED_TTL), "redislock_queued_ttl"
            ),
            on_duplicate=check_on_duplicate(
                get("redislock_on_duplicate", "existing"), "redislock_on_duplicate"
            ),
        )


CLIENT_KEYS: Final = (
    "redislock_url",
    "redislock_client_options",
    "redislock_cluster",
    "broker_url",
    "broker_write_url",
    "broker_use_ssl",
    "redislock_transport_options",
    "broker_transport_options",
    "result_backend",
    "result_backend_transport_options",
    "redislock_min_replicas",
    "redislock_replica_timeout",
    "redislock_wait_aof",
    "redislock_urls",
    "redislock_redlock_max_ttl",
)
"""The settings the app's Redis client is made from (:func:`.client.get_redis`;
``broker_url`` and ``broker_write_url`` feed the default URL)."""

SETTINGS_KEYS: Final = (
    "redislock_prefix",
    "redislock_lock_ttl",
    "redislock_queued_ttl",
    "redislock_on_duplicate",
    "redislock_restart_grace",
    *CLIENT_KEYS,
)
"""The settings :class:`Settings` and the client are read from. The client's count too:
options made under one Settings object may keep lock objects on the client of that
moment (``SingletonOptions.locks``)."""


def settings_for(app: Celery) -> Settings:
    """:meth:`Settings.from_app`: the settings as they are now."""
    return Settings.from_app(app)


def check_prefix(value: object, argument: str = "prefix") -> str:
    """Return ``value`` if it can start a key: a non-empty string without braces."""
    prefix = check_name(value, argument)
    if "{" in prefix or "}" in prefix:
        # The lock name between braces is the Redis Cluster hash tag; a brace in the
        # prefix would move it.
        raise ConfigurationError(f"{argument} must not contain '{{' or '}}', got {prefix!r}")
    return prefix


def check_ttl(value: object, argument: str) -> float:
    """Return ``value`` as float seconds if it is a finite number > 0, else raise."""
    return ttl_to_ms(value, argument) / 1000.0


def restart_grace(app: Celery) -> float | bool:
    """``redislock_restart_grace``, checked: True (default) -- one renewal period of
    each lock or pool plus 2 s, ``min(lock_ttl, lock_ttl / 3 + 2)`` (see
    ``core/restart.py``); False or None -- none; seconds >= 2 (``MIN_GRACE``). After the
    lock Redis lost its data, singleton locks and permits are held this long for the
    runs that held them, which their renewal puts back (see ``core/restart.py``)."""
    return check_grace(app.conf.get("redislock_restart_grace", True), "redislock_restart_grace")


def check_on_duplicate(value: object, argument: str = "on_duplicate") -> str:
    """Return ``value`` if it is one of :data:`ON_DUPLICATE`, else raise."""
    if not isinstance(value, str) or value not in ON_DUPLICATE:
        raise ConfigurationError(f"{argument} must be one of {ON_DUPLICATE}, got {value!r}")
    return value


_NOTHING: Final = object()


def task_option(task: object, name: str, default: Any = None) -> Any:
    """The raw value of a task option; a function given as an option stays unbound.

    ``@app.task(lock_key=fn)`` and ``task_annotations`` store ``fn`` as a class
    attribute, where plain attribute access would bind it as a method receiving the
    task as its first argument.
    """
    if isinstance(task, Proxy):  # @app.task gives a lazy proxy until the app finalizes
        task = task._get_current_object()
    if isinstance(task, type):  # a task class (RedisLockTask.bind validates it)
        value = getattr(task, name, default)  # a function on a class stays unbound
        return value.__func__ if isinstance(value, staticmethod) else value
    # Looked up on the class, where Celery puts options: a function found there is not
    # bound (inspect.getattr_static would do too, at ten times the cost per call).
    value = vars(task).get(name, _NOTHING) if hasattr(task, "__dict__") else _NOTHING
    if value is _NOTHING:
        value = getattr(type(task), name, default)
    return value.__func__ if isinstance(value, staticmethod) else value
