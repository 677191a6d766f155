"""Redis Cluster: wake-ups by sharded vs classic pub/sub, and a primary killed.

Run from the repository root (~5 min)::

    python benchmarks/bench_cluster.py                 # 20 failover trials per mode
    python benchmarks/bench_cluster.py --trials 3      # a smoke test

It starts a local cluster of 3 primaries + 3 replicas
(``celery_redislock.testing_cluster.LocalCluster``, ``cluster-node-timeout`` 1000 ms)
and measures:

1. **Hand-off**, per wake-up mode, the modes interleaved round by round: 4 threads
   (each its own cluster client, so its own subscriber) take one lock in turn, holding
   it 1 ms. Reported: the hand-off latency (a release returns -> the next holder's
   acquire returns) p50/p99, sections per second, script round trips per section,
   and **how many nodes see each wake-up message** (cluster bus messages sent for
   PUBLISH/SPUBLISH per message published by the scripts, plus the node that ran
   the script). Modes: ``sharded`` (the default on Redis >= 7: SSUBSCRIBE on the
   slot's shard, SPUBLISH, SHARDNUMSUB); ``classic, same node`` (each waiter's one
   classic subscriber connection happens to be on the lock's node); ``classic,
   other node`` (it is on another node -- the usual case for a process that waits on
   locks of several slots: PUBSUB NUMSUB there sees nobody, so a release wakes the
   waiter instead of granting it the lock).
2. **A primary SIGKILLed** right after a grant, N trials per mode (no acks,
   ``min_replicas=1``: every primary has one replica), interleaved, as
   ``bench_failover.py`` does for Sentinel: the holder releases 0.5 s after the kill
   (retrying until a primary answers); a second client acquires from the kill on.
   Reported: double grants (the second client was granted the name while the
   holder's lease, lost with the primary, was still valid by the holder's clock),
   time until the name is usable again (p50/max), leases reported lost, fences not
   increasing, a stale release that touched the new holder, and the steady-state
   acquire p50 of each mode. After each trial the killed node is started again
   (empty; it rejoins as a replica) and the cluster waits until healthy.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import secrets
import sys
import threading
import time
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import parse_args, percentile, print_table
from _failover import TTL, kill_trial, report_kill, steady_state

from celery_redislock import RedisLock
from celery_redislock.core.keys import encode_name
from celery_redislock.core.pubsub import use_sharded_pubsub
from celery_redislock.testing_cluster import LocalCluster

CLIENT = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}
HANDOFF_MODES = ["sharded", "classic, same node", "classic, other node"]
FAILOVER_MODES = {"no acks": 0, "min_replicas=1": 1}
THREADS = 4
HOLD = 0.001


def name_on(cluster: LocalCluster, node: Any, stem: str) -> str:
    """A lock name ``stem-N`` whose slot ``node`` serves."""
    client = cluster.client()
    try:
        for n in range(100_000):
            name = f"{stem}-{n}"
            slot = client.keyslot("{" + encode_name(name) + "}")
            if cluster.owner(slot) is node:
                return name
    finally:
        client.close()
    raise LookupError(node)


def counters(cluster: LocalCluster) -> tuple[int, int]:
    """(messages the scripts published: PUBLISH + SPUBLISH calls, cluster bus
    messages sent for them), summed over every node."""
    published = bus = 0
    for node in cluster.running():
        with cluster.node_client(node, decode_responses=True) as client:
            stats = client.info("commandstats")
            published += sum(
                int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("publish", "spublish")
            )
            for line in client.execute_command("CLUSTER", "INFO").splitlines():
                key, _, value = line.partition(":")
                if key in (
                    "cluster_stats_messages_publish_sent",
                    "cluster_stats_messages_publishshard_sent",
                ):
                    bus += int(value)
    return published, bus


def handoff_round(
    cluster: LocalCluster, mode: str, name: str, other: str, seconds: float
) -> dict[str, Any]:
    """``THREADS`` threads take lock ``name`` in turn for ``seconds``."""
    clients = [cluster.client(**CLIENT) for _ in range(THREADS)]
    setup = cluster.client(**CLIENT)
    held = RedisLock(setup, other).acquire(blocking=False)
    assert held is not None
    for client in clients:
        use_sharded_pubsub(client, mode == "sharded")
        if mode == "classic, other node":
            # A first wait on a lock of another node puts the classic subscriber there.
            assert RedisLock(client, other).acquire(timeout=0.05) is None
    held.release()
    setup.close()
    released_at = [0.0]
    handoffs: list[float] = []
    stop = time.monotonic() + seconds
    sections = [0]
    guard = threading.Lock()

    def worker(client: Any) -> None:
        lock = RedisLock(client, name, ttl=5)
        while time.monotonic() < stop:
            lease = lock.acquire(timeout=10)
            now = time.monotonic()
            assert lease is not None
            with guard:
                if released_at[0]:
                    handoffs.append(now - released_at[0])
                released_at[0] = 0.0
                sections[0] += 1
            time.sleep(HOLD)
            released_at[0] = time.monotonic()  # the release is called: a hand-off starts
            lease.release()

    before_pub, before_bus = counters(cluster)
    before_trips = sum(_script_calls(cluster))
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    after_pub, after_bus = counters(cluster)
    trips = sum(_script_calls(cluster)) - before_trips
    for client in clients:
        client.close()
    published = after_pub - before_pub
    return {
        "handoffs": handoffs,
        "rate": sections[0] / took,
        "trips": trips / max(1, sections[0]),
        "nodes": 1 + (after_bus - before_bus) / max(1, published),
        "published": published,
    }


def _script_calls(cluster: LocalCluster) -> list[int]:
    """EVALSHA + EVAL calls per node: the lock scripts' round trips."""
    calls = []
    for node in cluster.running():
        with cluster.node_client(node, decode_responses=True) as client:
            stats = client.info("commandstats")
        calls.append(
            sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
        )
    return calls


def trial(cluster: LocalCluster, min_replicas: int) -> dict[str, Any]:
    """One grant, one SIGKILL of its primary, one second client; what happened."""
    primary = random.choice(cluster._primaries())
    name = name_on(cluster, primary, f"failover-{secrets.token_hex(3)}")
    holder_client, contender_client = cluster.client(**CLIENT), cluster.client(**CLIENT)
    holder = RedisLock(holder_client, name, ttl=TTL, min_replicas=min_replicas, replica_timeout=0.5)
    contender = RedisLock(contender_client, name, ttl=TTL)
    out, _ = kill_trial(
        holder, contender, lambda: cluster.kill(primary), (RedisError, RedisClusterException)
    )
    holder_client.close()
    contender_client.close()
    if not out["refused"]:
        cluster.restart(primary, timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="failover trials per mode")
    parser.add_argument("--rounds", type=int, default=6, help="hand-off rounds per mode")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a round")
    parser.add_argument("--steady", type=int, default=500, help="steady-state rounds")
    args = parse_args(parser)
    with LocalCluster() as cluster:
        node_a, node_b = cluster._primaries()[:2]
        name, other = name_on(cluster, node_a, "handoff"), name_on(cluster, node_b, "elsewhere")
        rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in HANDOFF_MODES}
        for _ in range(args.rounds):
            order = list(HANDOFF_MODES)
            random.shuffle(order)
            for mode in order:
                rounds[mode].append(handoff_round(cluster, mode, name, other, args.seconds))
        rows = []
        for mode, outcomes in rounds.items():
            handoffs = [h for o in outcomes for h in o["handoffs"]]
            rates = [o["rate"] for o in outcomes]
            rows.append(
                [
                    mode,
                    f"{percentile(handoffs, 50) * 1e3:.2f}",
                    f"{percentile(handoffs, 99) * 1e3:.2f}",
                    f"{min(rates):.0f}-{max(rates):.0f}",
                    f"{sum(o['trips'] for o in outcomes) / len(outcomes):.2f}",
                    f"{sum(o['nodes'] for o in outcomes) / len(outcomes):.2f}",
                ]
            )
        print_table(
            [
                "wake-ups",
                "hand-off p50 ms",
                "p99 ms",
                "sections/s",
                "round trips/section",
                "nodes per message",
            ],
            rows,
        )
        print(flush=True)

        steady = cluster.client(**CLIENT)
        cost = steady_state(steady, FAILOVER_MODES, args.steady, replica_timeout=0.5)
        steady.close()
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in FAILOVER_MODES}
        started = time.monotonic()
        for i in range(args.trials):
            order = list(FAILOVER_MODES)
            random.shuffle(order)
            for mode in order:
                outcome = trial(cluster, FAILOVER_MODES[mode])
                results[mode].append(outcome)
                print(f"trial {i + 1}/{args.trials} {mode}: {outcome}", flush=True)
        took = time.monotonic() - started
        with cluster.node_client(cluster.running()[0]) as node:
            version = node.info("server")["redis_version"]
    print()
    report_kill("mode", results, cost)
    print(
        f"\n{args.trials * len(FAILOVER_MODES)} trials in {took:.0f} s; redis-server "
        f"{version}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
