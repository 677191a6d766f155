"""``release_all``: release every lock and semaphore under a key prefix, for operators.

For crash recovery and maintenance windows: after every worker using the prefix has
stopped, a lock left by a killed process need not wait out its TTL. It finds the
primitives as the inventory does (``SCAN``, never ``KEYS``) and releases each
live lease by its exact token through the lease's own release script, so it is
owner-checked like a single release: a lease granted after it was read is never
touched, waiters are woken as by a normal release, and only leases that were live
are counted. Unlike its holder's release it leaves no record for a re-send, so the
holder's own ``release()`` answers False and reports the lease lost (#30).

Never run it while workers that use the prefix run: it releases leases whose holders
are still working, which then run beside the next holder (each reports its lease lost
at its next renewal, too late). celery-singleton's ``clear_locks`` on
``worker_ready`` has that flaw with more than one worker; this is a tool for when
nothing runs.
"""

from __future__ import annotations

import fnmatch
from typing import Literal

from ..errors import ConfigurationError
from .inventory import scan
from .lock import RedisLock
from .scripts import RedisClient, as_text
from .semaphore import RedisSemaphore
from .validate import check_client, check_name

__all__ = ["Kind", "release_all"]

Kind = Literal["lock", "semaphore"]
"""The kinds of primitive, as spelled in their keys."""

_KINDS: tuple[Kind, ...] = ("lock", "semaphore")


def release_all(
    client: RedisClient,
    *,
    prefix: str,
    match: str | None = None,
    kind: Kind | None = None,
) -> int:
    """Release every live lease of the locks and semaphores under ``prefix``.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        prefix: the key prefix the primitives were made with (``"redislock"`` by
            default in the core; the Celery layer's is ``app.conf.redislock_prefix``).
        match: a glob (``fnmatch``, case-sensitive) on the lock or semaphore *name*,
            e.g. ``"report:*"``; None: every name.
        kind: ``"lock"`` or ``"semaphore"``; None: both.

    Returns the number of leases released (a re-entered lock counts each lease).
    Safe only while no process that uses these names runs (see the module doc).
    """
    check_client(client)
    check_name(prefix, "prefix")
    if match is not None:
        check_name(match, "match")
    if kind is not None and kind not in _KINDS:
        raise ConfigurationError(f"kind must be 'lock', 'semaphore' or None, got {kind!r}")
    released = 0
    for found_kind, name in scan(client, prefix, _KINDS if kind is None else (kind,)):
        if match is not None and not fnmatch.fnmatchcase(name, match):
            continue
        released += _release_primitive(client, prefix, found_kind, name)
    return released


def _release_primitive(client: RedisClient, prefix: str, kind: str, name: str) -> int:
    """Release each lease of one primitive by its token; the number that were live."""
    if kind == "lock":
        lock = RedisLock(client, name, prefix=prefix)
        fields = client.hkeys(lock.keys.holders)
        tokens = [as_text(f)[2:] for f in fields if as_text(f).startswith("t:")]
        return sum(lock._revoke(token) for token in tokens)
    # The release script wakes waiters under the stored limit; the limit given here
    # is used only when none is stored.
    semaphore = RedisSemaphore(client, name, limit=1, prefix=prefix)
    tokens = [as_text(t) for t in client.zrange(semaphore.keys.holders, 0, -1)]
    return sum(semaphore._revoke(token) for token in tokens)
