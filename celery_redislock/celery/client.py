"""The Redis client of an app: ``redislock_url`` and friends, one client per process.

==============================  ======================================================
``redislock_url``               ``redis://``, ``rediss://`` or ``unix://`` URL of the
                                Redis holding the locks; default: the broker URL when
                                the broker is Redis (``broker_use_ssl`` then applies)
``redislock_client_options``    keyword arguments for ``from_url`` (timeouts, TLS, ...)
``redislock_cluster``           connect with ``redis.cluster.RedisCluster`` (False)
==============================  ======================================================
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import redis
from celery import Celery
from kombu.utils.url import maybe_sanitize_url
from redis.cluster import RedisCluster

from ..core.validate import check_bool
from ..errors import ConfigurationError
from .config import CLIENT_KEYS, conf_fingerprint
from .identity import IdentityCache

__all__ = ["get_redis", "redis_url"]

_REDIS_SCHEMES: Final = frozenset({"redis", "rediss", "unix", "redis+socket"})

# app -> (pid, url, options, client, conf fingerprint); weak, so a discarded app frees
# its pool.
_clients: IdentityCache[tuple[int, str, dict[str, Any], Any, Hashable | None]] = (
    IdentityCache()
)


def redis_url(app: Celery) -> str:
    """``redislock_url``, else the broker URL when the broker is Redis, else raise.

    Passwords are masked in error messages.
    """
    url = app.conf.get("redislock_url")
    if url is not None:
        if not isinstance(url, str) or urlsplit(url).scheme not in _REDIS_SCHEMES:
            raise ConfigurationError(
                "redislock_url must be a redis://, rediss:// or unix:// URL, "
                f"got {maybe_sanitize_url(url)!r}"
            )
        return _redis_py_url(url)
    broker = app.conf.broker_write_url  # also honours CELERY_BROKER_URL and friends
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else None
    elif isinstance(broker, str):
        broker = broker.split(";")[0]  # a failover list: the first URL is the primary
    if isinstance(broker, str) and urlsplit(broker).scheme in _REDIS_SCHEMES:
        return _redis_py_url(broker)
    raise ConfigurationError(
        f"redislock_url is not set and the broker URL {maybe_sanitize_url(broker)!r} is "
        "not a Redis URL: set redislock_url, e.g. app.conf.redislock_url = "
        "'redis://localhost:6379/0' (CELERY_REDISLOCK_URL with namespace='CELERY')"
    )


def _redis_py_url(url: str) -> str:
    # kombu spells a Unix socket redis+socket:///path?virtual_host=N; redis-py unix://.
    parts = urlsplit(url)
    if parts.scheme != "redis+socket":
        return url
    query = parts.query.replace("virtual_host=", "db=")
    return f"unix://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


def _client_options(app: Celery, url: str) -> dict[str, Any]:
    options = app.conf.get("redislock_client_options") or {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigurationError(
            f"redislock_client_options must be a dict of keyword arguments, got {options!r}"
        )
    ssl = app.conf.get("broker_use_ssl")
    if (
        app.conf.get("redislock_url") is None
        and url.startswith("rediss:")
        and isinstance(ssl, Mapping)
    ):
        # The broker's own server: its TLS settings (ssl_ca_certs, ...) apply too;
        # kombu and redis-py share those keyword names.
        return {**ssl, **options}
    return dict(options)


def get_redis(app: Celery) -> Any:
    """The Redis client of ``app``: made once per process, then reused.

    A client made before a fork is neither used nor closed in the child (closing it
    would shut down sockets the parent still uses); the child makes its own. Changing
    ``redislock_url`` or the options yields a new client. There is no lock: two
    threads racing here make two equivalent clients, and one is simply dropped.
    """
    pid = os.getpid()
    cached = _clients.get(app)
    # Fast path, taken on every task call: the settings did not change since.
    fingerprint = conf_fingerprint(app, CLIENT_KEYS)
    if (cached is not None and fingerprint is not None and cached[0] == pid
            and cached[4] == fingerprint):  # fmt: skip
        return cached[3]
    url = redis_url(app)
    options = _client_options(app, url)
    if cached is not None and cached[:3] == (pid, url, options):
        _clients.set(app, (*cached[:4], fingerprint))
        return cached[3]
    if check_bool(app.conf.get("redislock_cluster", False), "redislock_cluster"):
        client: Any = RedisCluster.from_url(url, **options)
    else:
        client = redis.Redis.from_url(url, **options)
    _clients.set(app, (pid, url, options, client, fingerprint))
    return client
