"""Restart grace: after the lock Redis lost its data, permits go back to their holders.

A Redis restarted empty (or flushed) forgets every lease while the runs holding them
go on. A semaphore made with ``restart_grace`` keeps the limit across that:

* **Detection.** Before its first call with a grace, each client sets its prefix's
  boot marker ``<prefix>:boot`` (:func:`mark`, once per client and prefix; no
  expiry). A script sent a grace that finds the marker missing knows the data was
  lost since: it sets the marker again (the server µs it found the loss).
* **Grace.** It then sets ``<prefix>:boot:grace`` to expire ``grace`` after the
  server's start (its uptime). Until then every script that hands permits out
  (acquire, release hand-offs, park, pump, take) first fills each semaphore it
  touches up to its limit with placeholder permits ``~restart:<i>`` expiring with the
  grace: newcomers wait (or park).
* **Putting back.** A renewal that finds its lease missing within the grace, with the
  marker newer than the lease's fence (fences are the server's µs clock at the
  grant), puts the lease back under its token, fence and owner, in a placeholder's
  place, and the lease is not reported lost. Past the grace (a flush or an evicted
  marker on a server older than it declares none), or with the placeholders all
  taken, it is reported lost: newcomers may hold its permit by then. A lease that
  expired or was released by force (the marker older than its fence) is still
  reported lost.

The grace must outlast the time every live holder takes to renew after the server
starts: one renewal period (renewal comes every TTL/3: ``renewal.schedule.DUE``) plus
the lateness of a renewal whose Redis was down (``renewal.schedule.LATE``, 2 s: a
failed call is tried again within a second, redis-py's own retries wait up to a
second). Its default (``restart_grace=True``) is just that, at most the TTL:
``min(TTL, TTL/3 + 2 s)`` -- 12 s for a 30 s lease, where it was the TTL before (#29
item 4: a 10 s blip refused singleton enqueues for 30 s). Leases are renewed often
enough for the grace they are given: a grace shorter than a TTL/3 period plus LATE
shortens their renewal period (``renewal.schedule.period``), so a grace given in
seconds must be at least :data:`MIN_GRACE` (``LATE``): a shorter one could not be met
by any renewal period, and would only make renewal spin (0.001 s: ~800 renewals a
second for one lease, where 2 s sends one). Leases that are not
renewed cannot be put back; the placeholders keep their permits from newcomers for
the grace only.
Standalone and Sentinel servers only: on Redis Cluster the marker keys are in another
slot, and no grace is sent. A client that never reached the
server before it lost its data (a process started afterwards) cannot tell a restart
from a fresh server: its first call marks the server as fresh, and when that call
is the first to reach a restarted server the loss goes unnoticed -- no grace (the
renewals that follow find the marker and report their leases lost).
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Final

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..errors import ConfigurationError
from .clients import AnyRedisClient
from .operations import Call, Operation, run
from .renewal.schedule import DUE, LATE
from .scripts import LuaScript, RedisClient
from .validate import ttl_to_ms

__all__ = [
    "MIN_GRACE",
    "check_grace",
    "default_grace_ms",
    "grace_args",
    "grace_ms",
    "mark",
    "marking",
]

MIN_GRACE: Final = LATE
"""The shortest restart grace given in seconds: a renewal whose Redis was down may come
this late after the server answers again (see the module)."""

_MARK = LuaScript("boot_mark.lua")
_marked: weakref.WeakKeyDictionary[AnyRedisClient, set[str]] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def default_grace_ms(ttl_ms: int) -> int:
    """The default restart grace (ms) of leases of ``ttl_ms``: one renewal period plus
    the lateness of a renewal after an outage, at most the TTL (see the module)."""
    return min(ttl_ms, math.ceil(ttl_ms * DUE) + round(LATE * 1000))


def check_grace(value: object, name: str = "restart_grace") -> float | bool:
    """``value`` as a restart grace: None or False -- none (False); True -- the
    default (see :func:`default_grace_ms`); seconds, at least :data:`MIN_GRACE` (not
    more than ``validate.MAX_SECONDS``). Anything else raises
    :class:`ConfigurationError` naming ``name`` and the value (0 too: False is none)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < MIN_GRACE:
        raise ConfigurationError(
            f"{name} must be True (the default grace), False or None (none) or seconds "
            f">= {MIN_GRACE:g}, got {value!r}"
        )
    return ttl_to_ms(value, name) / 1000.0


def grace_ms(
    value: object, ttl_ms: int, client: AnyRedisClient, name: str = "restart_grace"
) -> int:
    """The restart grace in ms for ``value`` (checked by :func:`check_grace`): 0 for
    none; True -- the default for leases of ``ttl_ms`` (:func:`default_grace_ms`);
    seconds. 0 as well on Redis Cluster (see the module)."""
    grace = check_grace(value, name)
    if grace is False:
        return 0
    ms = default_grace_ms(ttl_ms) if grace is True else round(grace * 1000)
    return 0 if isinstance(client, (RedisCluster, AsyncRedisCluster)) else ms


def mark(client: RedisClient, prefix: str) -> None:
    """Set ``prefix``'s boot marker on ``client``'s server unless this client did so
    before (one round trip, once per client and prefix)."""
    run(client, marking(client, prefix))


def marking(client: AnyRedisClient, prefix: str) -> Operation[None]:
    """:func:`mark` as an operation (see :mod:`.operations`), for any driver (an
    asyncio client's too)."""
    with _guard:
        done = _marked.get(client)
        if done is not None and prefix in done:
            return
    yield Call(_MARK, [f"{prefix}:boot"], [])
    with _guard:
        _marked.setdefault(client, set()).add(prefix)


def grace_args(semaphore: Any) -> list[bytes]:
    """``[grace]`` for a script's optional grace argument, when ``semaphore`` (a
    ``RedisSemaphore``) has one, its server marked first (see :func:`mark`); else ``[]``."""
    grace = semaphore._scripts.grace
    if grace is None:
        return []
    mark(semaphore._client, semaphore._keys.prefix)
    return [grace]
