"""Small lease operations the Celery glue needs beyond the core's public API.

* :func:`lock_for` -- the :class:`~celery_redislock.core.RedisLock` of a singleton key.
* :func:`release_token` / :func:`extend_token` -- act on a lease known only by its
  token (the worker's main process recomputes a child's execution token).
* :func:`hand_over` -- give a live lease to another process (a retry message) without
  releasing it.
"""

from __future__ import annotations

import time
from typing import Final

from ...core import Lease, RedisLock, RedlockLock
from ...core.lease import current_pid
from ..client import get_redis
from ..execution import AnyTask
from ..redlock import CeleryRedlock, redlock_clients
from .options import SingletonOptions

__all__ = ["SingletonLock", "extend_token", "hand_over", "lock_for", "release_token"]


_LOCKS_KEPT: Final = 1024


SingletonLock = RedisLock | RedlockLock
"""A singleton's lock: on the app's Redis, or a Redlock over ``redislock_urls``."""


def lock_for(task: AnyTask, key: str, options: SingletonOptions) -> SingletonLock:
    """The singleton lock named ``key`` on the app's Redis, or over its Redlock
    masters when ``redislock_urls`` is set (see :mod:`..redlock`).

    Lock objects are stateless between calls (a lease holds the state), so the recent
    ones are kept with the options they were made under (``options.locks``): building
    one costs more than the call it makes. A forked child makes its own (its client is
    not the parent's).
    """
    pid = current_pid()
    cached = options.locks.get(key)
    if cached is not None and cached[0] == pid:
        return cached[1]
    max_ttl = options.redlock_max_ttl
    masters = None if max_ttl is None else redlock_clients(task.app)
    lock: SingletonLock
    if masters is not None and max_ttl is not None:
        lock = CeleryRedlock(
            masters, key, ttl=options.lock_ttl, prefix=options.prefix, max_ttl=max_ttl
        )
    else:
        lock = RedisLock(
            get_redis(task.app),
            key,
            ttl=options.lock_ttl,
            prefix=options.prefix,
            restart_grace=options.restart_grace,
            **options.replicas,
        )
    if len(options.locks) >= _LOCKS_KEPT:
        options.locks.clear()  # one C call, safe beside other threads; refilled on use
    options.locks[key] = (pid, lock)
    return lock


def release_token(lock: SingletonLock, token: str) -> bool:
    """Release the lease ``token`` of ``lock`` if it is live; False when it was not."""
    return Lease(lock, token, 0, lock.ttl).release()


def extend_token(lock: SingletonLock, token: str, ttl: float) -> bool:
    """Set the lease ``token`` to expire ``ttl`` seconds from now if it is live."""
    # Known by its token alone, the lease has no deadline here: made as one already
    # due, so an extend that too few Redlock masters answered is not asked again
    # until a deadline it never had (False at once, the caller's fallback runs).
    return Lease(lock, token, 0, lock.ttl, granted_at=time.monotonic() - lock.ttl).extend(ttl)


def hand_over(lease: Lease, ttl: float) -> bool:
    """Stop renewing ``lease``, set it to expire in ``ttl`` seconds, and forget it here.

    The lease stays live for whoever adopts its token next (the retry's worker) or
    expires. This object then neither renews, releases nor reports it lost. Returns
    False when the lease was no longer ours.
    """
    return lease.hand_over(ttl)
