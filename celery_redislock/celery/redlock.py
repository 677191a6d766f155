"""Redlock in the Celery glue: ``redislock_urls`` makes singleton locks Redlock locks.

==============================  ======================================================
``redislock_urls``              list of ``redis://`` URLs of independent masters (an
                                odd number >= 3, each a different server): singleton
                                locks are :class:`~celery_redislock.RedlockLock`\\ s
                                over them (``redislock_url`` still serves the rest)
``redislock_redlock_max_ttl``   seconds: the restart grace of the masters and the
                                longest lease taken on them (default: the queued TTL,
                                ``redislock_queued_ttl``); a queued lease asked for
                                longer (a long countdown) is cut to it
==============================  ======================================================

A bounded task (``concurrency_limit``) under Redlock raises ``ConfigurationError``
when it is defined: a Redlock semaphore is not offered.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Hashable
from typing import Final

import redis
from celery import Celery

from ..core.redlock import RedlockLock
from ..core.validate import ttl_to_ms
from ..errors import ConfigurationError
from .sentinel import masked_url
from .upstream import conf_fingerprint

__all__ = ["CeleryRedlock", "check_not_bounded", "redlock_clients", "redlock_max_ttl"]

_KEYS: Final = ("redislock_urls", "redislock_client_options")
_clients: weakref.WeakKeyDictionary[Celery, tuple[int, Hashable, list[redis.Redis] | None]] = (
    weakref.WeakKeyDictionary()
)


def redlock_clients(app: Celery) -> list[redis.Redis] | None:
    """The masters' clients when ``redislock_urls`` is set (made once per process and
    settings), else None. A bad value raises ``ConfigurationError`` naming it."""
    fingerprint = conf_fingerprint(app, _KEYS)
    cached = _clients.get(app)
    pid = os.getpid()
    if (
        cached is not None
        and cached[0] == pid
        and fingerprint is not None
        and cached[1] == fingerprint
    ):
        return cached[2]
    urls = app.conf.get("redislock_urls")
    clients = None if urls is None else _make(app, urls)
    _clients[app] = (pid, fingerprint, clients)
    return clients


def _make(app: Celery, urls: object) -> list[redis.Redis]:
    if (
        isinstance(urls, str)
        or not isinstance(urls, (list, tuple))
        or not all(
            isinstance(url, str) and url.split(":", 1)[0] in ("redis", "rediss", "unix")
            for url in urls
        )
    ):
        shown = (
            [masked_url(u) if isinstance(u, str) else u for u in urls]
            if isinstance(urls, (list, tuple))
            else urls
        )
        raise ConfigurationError(
            f"redislock_urls must be a list of redis://, rediss:// or unix:// URLs of "
            f"independent masters, got {shown!r}"
        )
    options = app.conf.get("redislock_client_options") or {}
    clients = [redis.Redis.from_url(url, **options) for url in urls]
    try:
        RedlockLock(clients, "check", ttl=1.0)  # the count and distinct servers
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"redislock_urls {[masked_url(url) for url in urls]!r}: {exc}"
        ) from None
    return clients


def redlock_max_ttl(app: Celery, queued_ttl: float) -> float:
    """``redislock_redlock_max_ttl``, checked (default ``queued_ttl``)."""
    value = app.conf.get("redislock_redlock_max_ttl", queued_ttl)
    return ttl_to_ms(value, "redislock_redlock_max_ttl") / 1000


class CeleryRedlock(RedlockLock):
    """A singleton's Redlock: a lease asked for longer than ``max_ttl`` (a queued
    task's TTL plus a long countdown) is cut to it. A queued lease that lapses before
    the task starts is taken afresh when it starts (the task is never dropped)."""

    def _check_ttl(self, ttl: object, argument: str) -> int:
        return min(ttl_to_ms(ttl, argument), self._max_ttl_ms)


def check_not_bounded(app: Celery, name: object, limit: object) -> None:
    """Raise ``ConfigurationError`` when a task ``name`` with ``concurrency_limit`` =
    ``limit`` (None: not bounded) is defined on an app that uses Redlock."""
    if limit is None or app.conf.get("redislock_urls") is None:
        return
    raise ConfigurationError(
        f"task {name!r}: concurrency_limit={limit!r} cannot be used with redislock_urls "
        "(Redlock): a Redlock semaphore is not offered; bound the task on one Redis "
        "(redislock_url, Sentinel or Cluster) or drop redislock_urls"
    )
