"""Classic or sharded pub/sub for wake-ups: the one place that chooses.

On Redis Cluster a classic ``PUBLISH`` is broadcast over the cluster bus to every
node; ``SPUBLISH`` (Redis >= 7) goes only to the shard that serves the channel's slot
(a wake-up channel carries its lock's hash tag, so that is the lock's own shard), and
``PUBSUB SHARDNUMSUB`` there counts every subscriber of the channel in the cluster,
where ``PUBSUB NUMSUB`` counts one node's. So a client's waiters listen *sharded*
when the client is a ``RedisCluster`` whose primaries all run Redis >= 7, and
*classic* otherwise (a plain ``Redis``, a Sentinel-managed one, a 6.2 cluster, or a
server that does not answer). :func:`use_sharded_pubsub` overrides the choice.

The choice travels in each waiter's token: a process tag that starts with
:data:`SHARDED_TAG` (``<random>.s<tag>``; a classic one is ``<random>.<tag>``). The
scripts read it from there (``waiter_channel`` in ``lua/lib_lock.lua``) to publish
with ``SPUBLISH`` and count with ``SHARDNUMSUB``, and the notifier subscribes with the
:class:`PubSubMode` of the same client, so the channel, the publish command and the
subscription always agree.

When a slot moves to another node, the old node ends its shard subscriptions (an
``sunsubscribe`` the client did not ask for); redis-py's ``ClusterPubSub``
subscribes them again on the new owner once the client's slot map is refreshed (by
the next ``MOVED``), so the notifier then wakes the channel's waiters to ask at once.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from redis.client import PubSub
from redis.cluster import ClusterPubSub, RedisCluster
from redis.exceptions import RedisError

from .clients import cluster_primaries, command
from .scripts import RedisClient

__all__ = [
    "CLASSIC",
    "SHARDED",
    "SHARDED_TAG",
    "PubSubMode",
    "new_pubsub",
    "pubsub_mode",
    "use_sharded_pubsub",
]

log = logging.getLogger(__name__)

SHARDED_TAG = "s"
"""First character of the process tag of a waiter that listens sharded (hex tags
never start with it)."""

_IDLE_READ = 0.05  # a sharded subscriber with no node yet: sleep, do not spin
_SHARD_POLL = 0.005  # seconds between looks at a sharded subscriber's nodes


@dataclass(frozen=True)
class PubSubMode:
    """How a client's waiters listen: redis-py's method names and message types."""

    sharded: bool
    tag_prefix: str  # put before the process tag of waiter tokens
    subscribe: str  # PubSub method names
    unsubscribe: str
    confirmed: str  # message types: a subscription confirmed, a message, one ended
    message: str
    ended: str

    def pinned(self, pubsub: PubSub) -> bool:
        """True for a classic subscriber on a cluster: its one connection is on one
        node, which redis-py reconnects to and only to; when that node fails (a
        failover), the notifier makes a new subscriber (see ``Notifier._read``).
        Sharded subscriptions follow their slots by themselves."""
        return not self.sharded and isinstance(pubsub, ClusterPubSub)

    def read(self, pubsub: PubSub, timeout: float) -> dict[str, Any] | None:
        """The next message of ``pubsub``, waiting up to ``timeout`` seconds."""
        if not self.sharded or not isinstance(pubsub, ClusterPubSub):
            message: dict[str, Any] | None = pubsub.get_message(timeout=timeout)
            return message
        return _read_sharded(pubsub, timeout)


CLASSIC = PubSubMode(False, "", "subscribe", "unsubscribe", "subscribe", "message", "unsubscribe")
SHARDED = PubSubMode(
    True, SHARDED_TAG, "ssubscribe", "sunsubscribe", "ssubscribe", "smessage", "sunsubscribe"
)

_modes: dict[int, PubSubMode] = {}  # id(client) -> mode; dropped with the client
_modes_lock = threading.Lock()


class _MakesPubSub(Protocol):
    def pubsub(self) -> PubSub: ...


def new_pubsub(client: RedisClient) -> PubSub:
    """A new subscriber of ``client`` (a ``ClusterPubSub`` on a cluster).

    ``RedisCluster.pubsub`` is unannotated in redis-py: it is seen here through the
    signature both clients document, so callers get a typed ``PubSub``."""
    maker: _MakesPubSub = client
    return maker.pubsub()


def pubsub_mode(client: RedisClient) -> PubSubMode:
    """The mode of ``client``'s wake-ups, chosen on first use (see module docs)."""
    mode = _modes.get(id(client))
    if mode is None:
        chosen = _detect(client)
        with _modes_lock:
            mode = _modes.get(id(client))
            if mode is None:
                mode = _modes[id(client)] = chosen
                weakref.finalize(client, _modes.pop, id(client), None)
    return mode


def use_sharded_pubsub(client: RedisClient, sharded: bool) -> None:
    """Choose ``client``'s mode instead of detecting it (call before its first wait).

    ``sharded=True`` needs Redis >= 7 on every node; ``False`` (classic pub/sub, as on
    6.2) is always possible.
    """
    with _modes_lock:
        known = id(client) in _modes
        _modes[id(client)] = SHARDED if sharded else CLASSIC
        if not known:
            weakref.finalize(client, _modes.pop, id(client), None)


def _detect(client: RedisClient) -> PubSubMode:
    """Sharded for a ``RedisCluster`` whose first primary to answer runs Redis >= 7.

    One node stands for all (a cluster runs one version but for the length of a
    rolling upgrade, when the scripts fall back to PUBLISH on an older node, see
    ``tell`` in lib_lock.lua), so a node down (a failover under way) does not matter.
    """
    if not isinstance(client, RedisCluster):
        return CLASSIC
    error: Exception | None = None
    for node in cluster_primaries(client):
        try:
            info = command(client, "INFO", "server", target_nodes=node)
        except RedisError as exc:
            error = exc
            continue
        version = info.get("redis_version") if isinstance(info, dict) else None
        if version is None:
            error = TypeError(f"INFO server without redis_version: {info!r:.200}")
            continue
        return SHARDED if int(str(version).split(".")[0]) >= 7 else CLASSIC
    log.warning(
        "celery_redislock: no cluster primary told its Redis version (%r); this "
        "client's wake-ups use classic pub/sub",
        error,
    )
    return CLASSIC


def _read_sharded(pubsub: Any, timeout: float) -> dict[str, Any] | None:
    """The next shard message of a ``ClusterPubSub``, which holds one connection per
    node with subscriptions. Its own timed read waits the full timeout on each node
    in turn; here every node is checked at once, every :data:`_SHARD_POLL` seconds,
    so a message on any node ends the wait within that (redis-py offers no public
    way to await several nodes' sockets together)."""
    nodes = list(pubsub.node_pubsub_mapping.values())
    if len(nodes) == 1:
        message: dict[str, Any] | None = pubsub.get_sharded_message(timeout=timeout)
        return message
    deadline = time.monotonic() + timeout
    while True:
        message = pubsub.get_sharded_message(timeout=0)  # each node once
        left = deadline - time.monotonic()
        if message is not None or left <= 0:
            return message
        time.sleep(min(left, _SHARD_POLL if nodes else _IDLE_READ))
