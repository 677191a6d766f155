"""The Redis client of an app: ``redislock_url`` and friends, one client per process.

==============================  ======================================================
``redislock_url``               ``redis://``, ``rediss://``, ``unix://`` or Sentinel
                                (``sentinel://h:p;sentinel://h2:p``) URL of the Redis
                                holding the locks; default: the broker URL when the
                                broker is Redis or Sentinel (``broker_use_ssl`` then
                                applies), else a Redis result backend's URL
``redislock_transport_options`` ``master_name`` and ``sentinel_kwargs`` of a Sentinel
                                URL; default: the transport options of the broker
                                (or backend) whose URL is used
``redislock_client_options``    keyword arguments for ``from_url`` (timeouts, TLS, ...)
``redislock_min_replicas``      a grant counts once this many replicas acknowledged it
                                (``WAIT``); 0: at once (see core/replicas.py)
``redislock_replica_timeout``   seconds a grant waits for them (1.0)
``redislock_wait_aof``          confirm with ``WAITAOF`` (Redis >= 7.2, AOF on)
``redislock_cluster``           connect with ``redis.cluster.RedisCluster`` (False)
==============================  ======================================================
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import redis
from celery import Celery
from redis.cluster import RedisCluster

from ..core.replicas import DEFAULT_REPLICA_TIMEOUT
from ..core.scripts import RedisClient
from ..core.validate import check_bool, ttl_to_ms
from ..errors import ConfigurationError
from .config import CLIENT_KEYS
from .sentinel import SENTINEL_SCHEME, is_sentinel_url, masked_url, sentinel_client
from .upstream import conf_fingerprint

__all__ = ["connection_source", "get_redis", "redis_url", "replica_options", "transport_options"]

_REDIS_SCHEMES: Final = frozenset({"redis", "rediss", "unix", "redis+socket"})
_SCHEMES: Final = _REDIS_SCHEMES | {SENTINEL_SCHEME}
_OWN_OPTIONS: Final = "redislock_transport_options"

_Source = tuple[str, str, str, bool]  # what a client is made from: URL, options, cluster

# app -> (pid, settings fingerprint, what the client was made from, client); weak, so
# a discarded app frees its pool.
_clients: weakref.WeakKeyDictionary[Celery, tuple[int, Hashable, _Source, RedisClient]] = (
    weakref.WeakKeyDictionary()
)
_making = threading.Lock()


def _new_lock_in_child() -> None:
    # A fork while another thread made a client would leave the child's copy locked.
    global _making
    _making = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def redis_url(app: Celery) -> str:
    """The URL of the Redis holding the locks (see :func:`connection_source`)."""
    return connection_source(app)[0]


def connection_source(app: Celery) -> tuple[str, str]:
    """``(url, transport-options setting)``: ``redislock_url``, else the broker URL
    when the broker is Redis or Sentinel, else the result backend's when it is, else
    raise. The setting named goes with a Sentinel URL (``master_name``,
    ``sentinel_kwargs``): ``redislock_transport_options`` when set, else that of the
    URL's source (``broker_transport_options``, ``result_backend_transport_options``).

    Passwords are masked in error messages.
    """
    url = app.conf.get("redislock_url")
    if url is not None:
        if not isinstance(url, str) or _scheme(url) not in _SCHEMES:
            raise ConfigurationError(
                "redislock_url must be a redis://, rediss://, unix:// or sentinel:// URL, "
                f"got {masked_url(url) if isinstance(url, str) else url!r}"
            )
        return _redis_py_url(url), _OWN_OPTIONS
    broker = _one_url(app.conf.broker_write_url)  # also honours CELERY_BROKER_URL, ...
    if broker is not None and _scheme(broker) in _SCHEMES:
        return _redis_py_url(broker), "broker_transport_options"
    # A RabbitMQ broker beside a Redis result backend is a common deployment.
    backend = _one_url(app.conf.get("result_backend"))
    if backend is not None and _scheme(backend) in _SCHEMES:
        return _redis_py_url(backend), "result_backend_transport_options"
    raise ConfigurationError(
        f"redislock_url is not set and neither the broker URL {_masked(broker)!r} nor the "
        f"result backend {_masked(backend)!r} is a Redis or Sentinel URL: set "
        "redislock_url, e.g. app.conf.redislock_url = 'redis://localhost:6379/0' "
        "(CELERY_REDISLOCK_URL with namespace='CELERY')"
    )


def _masked(url: str | None) -> str | None:
    return None if url is None else masked_url(url)


def _scheme(url: str) -> str:
    return urlsplit(url.split(";")[0].strip()).scheme


def _one_url(value: object) -> str | None:
    """The URL to use of a setting that may list several: all of a Sentinel list
    (its addresses), else the first (a failover list: the first is the primary)."""
    if isinstance(value, (list, tuple)):
        value = ";".join(v for v in value if isinstance(v, str))
    if not isinstance(value, str) or not value:
        return None
    return value if is_sentinel_url(value) else value.split(";")[0]


def transport_options(app: Celery, setting: str) -> Mapping[str, Any]:
    """``redislock_transport_options`` when set, else ``setting``'s (the options of
    the broker or backend whose URL the locks use); checked to be a dict."""
    own = app.conf.get(_OWN_OPTIONS)
    name, options = (_OWN_OPTIONS, own) if own is not None else (setting, app.conf.get(setting))
    options = {} if options is None else options
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"{name} must be a dict, got {options!r}")
    return options


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


def get_redis(app: Celery) -> RedisClient:
    """The Redis client of ``app``: made once per process, then reused.

    A client made before a fork is neither used nor closed in the child (closing it
    would shut down sockets the parent still uses); the child makes its own. Changing
    ``redislock_url`` or the options yields a new client. One is made at a time: two
    threads racing here made two clients and one was dropped, and what holds a client
    weakly (the metrics recorder) lost what it had taken for the dropped one -- the
    first events of a threaded process, and every later one of an app whose metrics
    sink was made on it (#27).
    """
    pid = os.getpid()
    cached = _clients.get(app)
    fingerprint = conf_fingerprint(app, CLIENT_KEYS)
    if cached is not None and cached[:2] == (pid, fingerprint):
        return cached[3]  # taken on every task call: the settings did not change since
    with _making:
        return _make_client(app, pid, fingerprint)


def _make_client(app: Celery, pid: int, fingerprint: Hashable) -> RedisClient:
    cached = _clients.get(app)
    if cached is not None and cached[:2] == (pid, fingerprint):
        return cached[3]  # another thread made it meanwhile
    url, setting = connection_source(app)
    options = _client_options(app, url)
    sentinel = is_sentinel_url(url)
    transport = transport_options(app, setting) if sentinel else {}
    cluster = check_bool(app.conf.get("redislock_cluster", False), "redislock_cluster")
    source = (url, repr(transport), repr(options), cluster)
    if cached is not None and cached[0] == pid and cached[2] == source:
        _clients[app] = (pid, fingerprint, source, cached[3])
        return cached[3]
    client: RedisClient
    if sentinel:
        if cluster:
            raise ConfigurationError(
                "redislock_cluster=True cannot use a Sentinel URL "
                f"({masked_url(url)!r}): a cluster has no Sentinels"
            )
        client = sentinel_client(url, transport, options, setting)
    elif cluster:
        client = RedisCluster.from_url(url, **options)
    else:
        client = redis.Redis.from_url(url, **options)
    _clients[app] = (pid, fingerprint, source, client)
    return client


def replica_options(app: Celery) -> dict[str, Any]:
    """The ``min_replicas`` / ``replica_timeout`` / ``wait_aof`` keyword arguments of
    the app's locks and semaphores (``redislock_min_replicas``, ...), checked; ``{}``
    when grants count at once (the default)."""
    get = app.conf.get
    min_replicas = get("redislock_min_replicas", 0)
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise ConfigurationError(
            f"redislock_min_replicas must be an int >= 0, got {min_replicas!r}"
        )
    timeout = (
        ttl_to_ms(
            get("redislock_replica_timeout", DEFAULT_REPLICA_TIMEOUT), "redislock_replica_timeout"
        )
        / 1000.0
    )
    wait_aof = check_bool(get("redislock_wait_aof", False), "redislock_wait_aof")
    options: dict[str, Any] = {}
    if min_replicas or wait_aof:
        options = {"min_replicas": min_replicas, "replica_timeout": timeout, "wait_aof": wait_aof}
    return options
