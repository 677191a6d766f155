"""Celery glue: task base class, decorators, singleton keys, settings and signals.

Imports the core, never the reverse. Modules:

* :mod:`.task` -- ``RedisLockTask`` and ``SingletonTask``; :mod:`.decorators` --
  ``singleton_task`` and ``bounded_task``;
* :mod:`.options` -- the task options; :mod:`.config` -- the ``redislock_*`` settings;
  :mod:`.bounded_options` -- the bounded-concurrency options and settings;
* :mod:`.bounded` (worker) -- the concurrency permit of a run, re-scheduling;
* :mod:`.enqueue` (producer), :mod:`.execution` and :mod:`.singleton` (worker),
  :mod:`.cleanup` (the worker's main process) -- the lock's life cycle;
* :mod:`.signature` -- the singleton key of a task call (with :mod:`.binding` and
  :mod:`.canonical`); :mod:`.tokens` -- headers, execution tokens, owner ids;
* :mod:`.client` -- the per-app, per-process Redis client;
* :mod:`.signals` -- signals for acquired, duplicate, released and lost leases and
  for permits acquired, re-scheduled and released.
"""

from __future__ import annotations

from .decorators import bounded_task, singleton_task
from .task import RedisLockTask, SingletonTask

__all__ = ["RedisLockTask", "SingletonTask", "bounded_task", "singleton_task"]
