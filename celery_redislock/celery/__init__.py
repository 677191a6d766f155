"""Celery glue: the task base class and decorators, feature folders, settings, client, signals.

Imports the core, never the reverse. Folders: :mod:`.singleton` (singleton tasks),
:mod:`.bounded` (bounded concurrency), :mod:`.ratelimit` (global rate limits),
:mod:`.cli` (the ``celery redislock`` command), :mod:`.metrics` (counters in Redis,
the Prometheus exporter, the live page).
Shared modules beside them:

* :mod:`.task` -- ``RedisLockTask`` and ``SingletonTask``; :mod:`.decorators` --
  ``singleton_task``, ``bounded_task`` and ``rate_limited_task``;
* :mod:`.config` -- the ``redislock_*`` settings and raw task options;
  :mod:`.client` -- the per-app, per-process Redis client; :mod:`.upstream` -- every
  private name of another library the package uses;
* :mod:`.execution` -- what a run holds and the guard seam; :mod:`.cleanup` -- the
  worker's main process cleans up after runs that could not; :mod:`.background` -- a
  thread per app in the worker's main process (the rate pump, the parking sweeper);
* :mod:`.tokens` -- message headers, execution tokens, owner ids;
* :mod:`.signals` -- signals for acquired, duplicate, released and lost leases and
  for permits acquired, re-scheduled and released.

See docs/architecture.md for the layers and the life of a call.
"""

from __future__ import annotations

from .decorators import bounded_task, rate_limited_task, singleton_task
from .metrics import connect as _connect_metrics
from .task import RedisLockTask, SingletonTask

# Counting is on unless an app sets redislock_metrics = False (#27); the receivers
# are connected here so that every process that loads the glue counts alike.
_connect_metrics()

__all__ = [
    "RedisLockTask",
    "SingletonTask",
    "bounded_task",
    "rate_limited_task",
    "singleton_task",
]
