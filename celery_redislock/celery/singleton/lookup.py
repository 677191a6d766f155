"""Read-only lookups for given arguments: the singleton key, and the copy holding it.

``task.singleton_key(*args, **kwargs)`` is the lock name ``apply_async`` would use for
that call (celery-singleton's ``generate_lock``); ``task.singleton_holder(*args,
**kwargs)`` is the ``AsyncResult`` of the copy that holds it, queued or running, or None
(celery-singleton's ``get_existing_task_id``). Neither takes nor changes anything: one
read-only script call per lock read.
"""

from __future__ import annotations

from typing import Any

from celery.result import AsyncResult

from ...core import RedisLock, RedlockLock
from ..execution import AnyTask
from ..options import options_of
from ..tokens import parse_owner
from .leases import lock_for
from .signature import call_key

__all__ = ["QUEUED_SUFFIX", "queued_key", "singleton_holder", "singleton_key", "ttl_left"]

QUEUED_SUFFIX = "|queued"
"""Suffix of the queued lock's name in ``singleton_mode="until_and_while_executing"``."""


def queued_key(key: str) -> str:
    """The name of the queued lock beside the running lock ``key`` (mode
    ``until_and_while_executing``: one copy queued under it, one running under ``key``)."""
    return key + QUEUED_SUFFIX


def singleton_key(task: AnyTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The singleton lock name of ``task(*args, **kwargs)``; a call that does not fit
    the task's signature raises ``TypeError``, as ``delay`` would."""
    return call_key(task, args, kwargs)


def singleton_holder(
    task: AnyTask, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncResult[Any] | None:
    """The ``AsyncResult`` of the copy holding the lock of ``task(*args, **kwargs)``
    (the running copy first, then a queued one), or None when it is free."""
    options = options_of(task).singleton
    key = singleton_key(task, args, kwargs)
    names = [key]
    if options.mode == "until_and_while_executing":
        names.append(queued_key(key))
    for name in names:
        task_id, _ = parse_owner(_owner(lock_for(task, name, options)))
        if task_id is not None:
            return task.AsyncResult(task_id)
    return None


def _owner(lock: RedisLock | RedlockLock) -> str | None:
    """The owner id of the lock's holder: for Redlock, the one a majority holds."""
    if isinstance(lock, RedisLock):
        return lock.info().owner
    seen = [i.owner for i in lock.info_by_master().values() if not isinstance(i, Exception)]
    for owner in set(seen) - {None}:
        if seen.count(owner) > len(lock.masters) // 2:
            return owner
    return None


def ttl_left(lock: RedisLock | RedlockLock) -> float | None:
    """Seconds left on the lock's longest lease (None when free or unknown): one
    read-only round trip (for Redlock, the shortest answer of the masters)."""
    if isinstance(lock, RedisLock):
        infos = [lock.info()]
    else:
        infos = [i for i in lock.info_by_master().values() if not isinstance(i, Exception)]
    lefts = [max((h.ttl_left for h in i.holders), default=0.0) for i in infos]
    left = min(lefts, default=0.0)
    return round(left, 3) if left > 0 else None
