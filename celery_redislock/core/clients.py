"""The Redis clients the core's operations run through, as types, and typed views of
the few redis-py calls it makes that redis-py leaves unannotated.

:data:`RedisClient` is a synchronous client; :data:`AsyncRedisClient` its
``redis.asyncio`` twin (used by ``celery_redislock.asyncio``); :data:`AnyRedisClient`
either, for the I/O-free parts both drive (keys, arguments, restart grace). Nothing
here imports ``redis.asyncio`` at run time.

The helpers narrow redis-py's unannotated calls (``RedisCluster.get_primaries``,
``get_node_from_key``, ``execute_command``, a pipeline's ``execute_command``) at this
one boundary: each sees the client through a :class:`~typing.Protocol` of the
signature redis-py documents, so the rest of the package gets real types, not ``Any``.
A reply whose shape depends on the command is :class:`object`, for the caller to
check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.typing import EncodableT, KeyT

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis
    from redis.asyncio.client import PubSub
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

__all__ = [
    "AnyRedisClient",
    "AsyncRedisClient",
    "RedisClient",
    "close_pubsub",
    "cluster_nodes",
    "cluster_primaries",
    "command",
    "key_node",
    "pipelined",
]

RedisClient: TypeAlias = "Redis | RedisCluster"
"""A synchronous client the core works through: a plain (or Sentinel-managed)
``redis.Redis``, or a ``redis.cluster.RedisCluster``."""

AsyncRedisClient: TypeAlias = "AsyncRedis | AsyncRedisCluster"
"""An asyncio client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

AnyRedisClient: TypeAlias = "RedisClient | AsyncRedisClient"
"""A sync or asyncio client, for what the sync and async twins share without I/O."""


class _Cluster(Protocol):
    def get_primaries(self) -> list[ClusterNode]: ...

    def get_nodes(self) -> list[ClusterNode]: ...

    def get_node_from_key(self, key: KeyT, replica: bool = False) -> ClusterNode: ...


class _Commands(Protocol):
    def execute_command(self, *args: EncodableT, **options: object) -> object: ...


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class _Pipeline(Protocol):
    def execute_command(self, *args: EncodableT) -> object: ...

    def execute(self, raise_on_error: bool = True) -> list[object]: ...


def cluster_primaries(cluster: RedisCluster) -> list[ClusterNode]:
    """The primaries of ``cluster``, as its slot map names them now."""
    view: _Cluster = cluster
    return view.get_primaries()


def cluster_nodes(cluster: RedisCluster) -> list[ClusterNode]:
    """Every node of ``cluster``, primaries and replicas."""
    view: _Cluster = cluster
    return view.get_nodes()


def key_node(cluster: RedisCluster, key: KeyT) -> ClusterNode:
    """The primary serving ``key``'s slot."""
    view: _Cluster = cluster
    return view.get_node_from_key(key)


def command(client: RedisClient, *args: EncodableT, **options: object) -> object:
    """``client.execute_command(*args, **options)``: the reply, whose shape the
    command decides (the caller checks it)."""
    view: _Commands = client
    return view.execute_command(*args, **options)


def pipelined(client: Redis, *commands: tuple[EncodableT, ...]) -> list[object]:
    """``commands`` sent in one non-transactional pipeline on one connection of
    ``client``; each one's reply, or the exception it raised (never raised here)."""
    pipe: _Pipeline = client.pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)
    return pipe.execute(raise_on_error=False)


async def close_pubsub(pubsub: PubSub) -> None:
    """``await pubsub.aclose()``: a ``redis.asyncio`` pub/sub's connection closed."""
    view: _Closable = pubsub
    await view.aclose()
