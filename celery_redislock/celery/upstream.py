"""Every private name of another library that the package uses, each with its reason.

Nothing else in the package touches a leading-underscore name of redis-py, kombu,
Celery or asyncio (``tests/unit/test_architecture.py`` checks it). Each name here
has a test in ``tests/unit/test_upstream.py`` that fails loudly when an upgrade
removes it, never a silent fallback:

* ``kombu.transport.redis.Channel._connparams`` -- patched in the worker's main
  process, for a worker exit on a lost broker connection (celery/kombu#582, below).
* ``celery.app.task.Task._dump_pydantic_arguments`` -- read, to key a call of a
  ``pydantic=True`` task as ``apply_async`` will send it (celery/celery#9023 added
  it as a private class attribute, with no public entry point).
* ``celery.worker.request.Request._context`` -- read, for the run Context of a
  message the worker's main process parks before any pool process ran it
  (:func:`request_context`): Celery builds it as a private cached property and hands
  it to every signal as ``request=self._context``, with no public accessor.
* ``app.conf.maps`` -- the mappings of Celery's configuration view (undocumented),
  for :func:`conf_fingerprint`: Celery has no public way to tell that the
  configuration changed (the request for configuration signals, celery/celery#1380,
  was closed; 5.7's ``on_configure``/``on_after_configure`` fire once), and reading
  the ~30 settings a task's options depend on through ``app.conf.get`` on every call
  (about 4 us each: every source is tried in turn) cost a singleton task's
  ``delay`` -> result round trip 1.33x -> 1.51x of a plain task's
  (``benchmarks/bench_singleton.py``, #30).

**The kombu workaround.** On a lost broker connection celery 5.7's consumer first
``collect()``\\ s the connection (which closes its transport: ``transport.client``
becomes None) and then ``close()``\\ s it; the second close closes the default
channel again, whose QoS tries once more to restore the messages it still holds
unacknowledged (prefetched, or one whose ack the outage broke). kombu's Redis channel
then builds a connection pool from ``transport.client`` and fails with
``AttributeError: 'NoneType' object has no attribute 'hostname'`` (the traceback of
celery/kombu#582), which is not one of the connection errors celery ignores there:
``Unrecoverable error``, the worker exits. Plain celery meets it whenever a message
is unacknowledged at that moment (always with countdown/ETA messages); a worker whose
runs are parked or waiting out the outage meets it as well.

The fix: a channel whose transport was collected raises the transport's own
``ConnectionError`` instead, which ``close()`` ignores, as it ignores the same
failure on the first close. The messages stay in the broker's unacked set, where
kombu restores them after ``visibility_timeout`` as it always has; nothing else
changes. Installed by :func:`connect` on ``worker_init`` (never in a client).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from itertools import repeat
from typing import TYPE_CHECKING, Any, Final

import redis
from celery import Celery, signals
from celery.app.base import PendingConfiguration  # type: ignore[attr-defined]  # not in celery-types
from celery.app.task import Context
from kombu.transport import redis as kombu_redis

if TYPE_CHECKING:
    from celery.worker.request import Request

__all__ = [
    "CONNPARAMS",
    "DUMP_PYDANTIC",
    "conf_fingerprint",
    "connect",
    "pydantic_dumper",
    "REQUEST_CONTEXT",
    "request_context",
    "install",
    "installed",
    "uninstall",
]

CONNPARAMS = "_connparams"
"""kombu's Redis channel method patched by :func:`install` (celery/kombu#582)."""

DUMP_PYDANTIC = "_dump_pydantic_arguments"
"""Celery's per-task dumper of pydantic models (celery/celery#9023), or None."""

REQUEST_CONTEXT = "_context"
"""Celery's worker Request's run Context, a private cached property (see above)."""

_lock = threading.Lock()
_original: Callable[..., Any] | None = None  # kombu's own method while installed


def pydantic_dumper(task: object) -> Callable[[Any, Any], tuple[Any, Any]] | None:
    """The task's dumper of pydantic models, ``(args, kwargs) -> (args, kwargs)``, which
    ``Task.apply_async`` applies before serializing (unless the call asks for
    pickle; the caller checks that); None for a task without ``pydantic=True``.
    Raises AttributeError when Celery no longer has the attribute at all."""
    dump: Callable[[Any, Any], tuple[Any, Any]] | None = getattr(task, DUMP_PYDANTIC)
    return dump


def request_context(request: Request) -> Context:
    """The run Context of a worker's ``request``: the one Celery's own signals carry
    for it (``request=self._context`` in celery/worker/request.py). An ``AttributeError``
    when an upgrade renames it: never a Context made up here."""
    context: Context = getattr(request, REQUEST_CONTEXT)
    return context


def conf_fingerprint(app: Celery, keys: tuple[str, ...]) -> Hashable | None:
    """A cheap value that changes whenever ``app.conf``'s ``keys`` may have changed.

    Every change made at run time lands in the first mapping of the configuration
    (``conf.update``, ``conf.x = ...``) and ``config_from_object`` adds or replaces
    mappings, so the identity of the mappings plus the raw values of ``keys`` in the
    first one tell when to read again. None while the configuration is not loaded
    (then nothing is cached). Raises when Celery's configuration no longer has that
    shape (``tests/unit/test_upstream.py``), never silently stops caching.
    """
    conf = app.conf
    maps = conf.maps
    if isinstance(maps, list) and len(maps) == 1 and isinstance(maps[0], PendingConfiguration):
        return None  # app.conf before its first read
    if not isinstance(maps, list) or not maps or not isinstance(maps[0], dict):
        raise TypeError(f"app.conf.maps no longer starts with a dict: {maps!r:.200}")
    changes = maps[0]
    values = tuple(map(changes.get, keys, repeat(_NOTHING)))
    kinds = tuple(map(type, values))
    # A scalar stands for itself, with its type (1, 1.0 and True pass different
    # checks); anything else by its repr, which also sees a dict changed in place.
    if not _PLAIN.issuperset(kinds):
        values = tuple(v if type(v) in _PLAIN else repr(v) for v in values)
    return (id(conf), len(changes), *map(id, maps), values, kinds)


_NOTHING: Final = object()
_PLAIN: Final = frozenset({str, int, float, bool, type(None), type(_NOTHING)})


def install() -> bool:
    """Patch kombu's Redis channel (once; idempotent). Raises AttributeError when
    kombu no longer has the method: the workaround must be revisited, not skipped."""
    global _original
    channel = kombu_redis.Channel
    with _lock:
        if _original is not None:
            return True
        original = getattr(channel, CONNPARAMS)

        def _connparams(self: Any, asynchronous: bool = False) -> Any:
            if getattr(self.connection, "client", None) is None:
                raise redis.ConnectionError(
                    "the broker connection was closed (transport collected)"
                )
            return original(self, asynchronous=asynchronous)

        setattr(channel, CONNPARAMS, _connparams)
        _original = original
    return True


def installed() -> bool:
    """True while :func:`install`'s patch is in place."""
    return _original is not None


def uninstall() -> None:
    """Put kombu's own method back (for tests of the failure it works around)."""
    global _original
    with _lock:
        if _original is not None:
            setattr(kombu_redis.Channel, CONNPARAMS, _original)
            _original = None


def _on_worker_init(**_: object) -> None:
    install()


def connect() -> None:
    """Install the fix in every worker's main process as it starts (idempotent)."""
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_redislock.upstream"
    )
