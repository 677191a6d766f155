"""A Redis client from a Celery/kombu Sentinel URL: ``sentinel://[:password@]host:port``,
several joined by ``;`` (or given as a list), plus the ``master_name`` and
``sentinel_kwargs`` of a transport-options setting.

The URL's password (and user name) and database (``/N``) are those of the Redis
primary, as in kombu and Celery's Sentinel result backend; ``sentinel_kwargs`` are the
connection options of the Sentinels themselves (e.g. their own password). The client
is ``Sentinel(...).master_for(master_name)``: every new connection asks the
Sentinels for the current primary, so after a failover the client reaches the
promoted replica by itself. Imports the core's validation only, never the reverse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from redis import Redis
from redis.sentinel import Sentinel

from ..errors import ConfigurationError

__all__ = ["SENTINEL_SCHEME", "is_sentinel_url", "masked_url", "sentinel_client"]

SENTINEL_SCHEME: Final = "sentinel"
DEFAULT_SENTINEL_PORT: Final = 26379


_PASSWORD = re.compile(r"(//[^:@/]*:)[^@/]*@")


def masked_url(url: str) -> str:
    """``url`` with any password replaced by ``**`` (parses nothing, so a malformed
    URL can still be shown)."""
    return _PASSWORD.sub(r"\1**@", url)


def is_sentinel_url(url: str) -> bool:
    """True for ``sentinel://...`` (one address or several joined by ``;``)."""
    return urlsplit(url.split(";")[0].strip()).scheme == SENTINEL_SCHEME


def sentinel_client(
    url: str, transport_options: Mapping[str, Any], options: Mapping[str, Any], setting: str
) -> Redis:
    """``Sentinel(hosts).master_for(master_name)`` for ``url``.

    ``transport_options`` hold ``master_name`` (required) and ``sentinel_kwargs``;
    ``setting`` is the name of the setting they came from, for error messages.
    ``options`` (``redislock_client_options``) go to the primary's connections.
    """
    hosts, credentials, db = _parse(url)
    master_name = transport_options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ConfigurationError(
            f"the Sentinel URL {masked_url(url)!r} needs {setting}['master_name'] "
            f"(the name the Sentinels monitor, e.g. {{'master_name': 'mymaster'}}), "
            f"got {master_name!r}"
        )
    sentinel_kwargs = transport_options.get("sentinel_kwargs")
    if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, Mapping):
        raise ConfigurationError(
            f"{setting}['sentinel_kwargs'] must be a dict of connection options for the "
            f"Sentinels, got {sentinel_kwargs!r}"
        )
    # Without sentinel_kwargs, redis-py gives the Sentinels the socket_* options.
    sockets = {key: value for key, value in options.items() if key.startswith("socket_")}
    sentinel: Any = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        sentinel_kwargs=dict(sentinel_kwargs) if sentinel_kwargs is not None else None,
        **sockets,
    )
    # master_for is unannotated in redis-py; its redis_class defaults to Redis.
    client: Redis = sentinel.master_for(master_name, **{"db": db, **credentials, **options})
    return client


def _parse(url: str) -> tuple[list[tuple[str, int]], dict[str, str], int]:
    """The Sentinels' addresses, the primary's credentials and its database."""
    hosts: list[tuple[str, int]] = []
    credentials: dict[str, str] = {}
    db: int | None = None
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        try:
            port = DEFAULT_SENTINEL_PORT if parsed.port is None else parsed.port
        except ValueError:
            port = -1
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname or port < 1:
            raise ConfigurationError(
                "a Sentinel URL is sentinel://[:password@]host:port[/db], several joined "
                f"by ';', got {masked_url(part)!r} in {masked_url(url)!r}"
            )
        hosts.append((parsed.hostname, port))
        if parsed.password and not credentials:
            credentials["password"] = unquote(parsed.password)
            if parsed.username:
                credentials["username"] = unquote(parsed.username)
        path = parsed.path.strip("/")
        if db is None and path:
            if not path.isdigit():
                raise ConfigurationError(
                    f"the database of a Sentinel URL must be a number, got {path!r} in "
                    f"{masked_url(url)!r}"
                )
            db = int(path)
    return hosts, credentials, db or 0
