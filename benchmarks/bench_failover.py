"""What a Sentinel failover does to a lock, with and without replica acknowledgement.

Run from the repository root (~8 min for 20 trials per mode)::

    python benchmarks/bench_failover.py              # 20 trials per mode
    python benchmarks/bench_failover.py --trials 3   # a smoke test

It starts a primary, two replicas and three Sentinels
(``celery_redislock.testing_sentinel.SentinelGroup``: ``down-after-milliseconds``
1000, ``failover-timeout`` 3000) and runs, per trial, for one mode at a time (the
modes interleaved trial by trial: no acks, ``min_replicas=1``, ``min_replicas=2``):

1. a holder, through ``Sentinel.master_for``, is granted a lease (TTL 8 s);
2. the primary is SIGKILLed right after the grant returned;
3. the holder "finishes its work" 0.5 s after its grant and releases, retrying
   through the outage until some primary answers (True: its lease survived; False:
   it was lost, and ``lease.lost`` reports it);
4. a second client acquires the same name through Sentinel from the moment of the
   kill (retrying while no primary answers); the trial records when it is granted.

Reported per mode: **double grants** (the second client was granted the name while
the holder's lease, lost with the primary, was still valid by the holder's own
clock), the **time until the name is usable** again (kill -> second grant, p50 and
max), **leases reported lost**, fence order (the second fence must exceed the
first), a stale release that touched the new holder (must be 0), and the
steady-state **acquire p50** of each mode (acquire-only latency, the modes
interleaved call by call on the healthy group before the trials).

After each trial the killed node is started again (empty) as a replica, and the
next trial waits until the Sentinels agree and every replica is online.

A second scenario, **partition** (``--scenario partition``), freezes the primary
(SIGSTOP) instead: a replica is promoted, the old primary wakes up still believing it
is the primary (until the Sentinels demote it, ~1 s later), and a holder whose
client still has a connection to it asks for the name there while a second client
is granted it on the new primary through Sentinel. Reported: double grants, grants
refused (``NotReplicated``), and stale leases reported lost after the demotion.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import secrets
import signal
import sys
import time
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import parse_args, print_table
from _failover import TTL, kill_trial, report_kill, until_answered
from _failover import steady_state as _steady_state

from celery_redislock import NotReplicated, RedisLock
from celery_redislock.testing_sentinel import SentinelGroup

MODES = {"no acks": 0, "min_replicas=1": 1, "min_replicas=2": 2}
CLIENT = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}
REPLICA_TIMEOUT = 0.5
ERRORS = (redis.ConnectionError, redis.TimeoutError)
SETTLE = 3.0
"""Seconds the Sentinels must agree before the next trial: a Sentinel still finishing
the last failover can otherwise start another (REDIS-FACTS.md)."""


def steady_state(group: SentinelGroup, rounds: int) -> dict[str, float]:
    """Acquire-only p50 (µs) per mode, interleaved call by call, on a healthy group."""
    return _steady_state(group.master_client(**CLIENT), MODES, rounds, REPLICA_TIMEOUT)


def trial(group: SentinelGroup, min_replicas: int) -> dict[str, Any]:
    """One grant, one SIGKILL of the primary, one second client; what happened."""
    name = f"failover-{secrets.token_hex(4)}"
    holder = RedisLock(
        group.master_client(**CLIENT),
        name,
        ttl=TTL,
        min_replicas=min_replicas,
        replica_timeout=REPLICA_TIMEOUT,
    )
    contender = RedisLock(group.master_client(**CLIENT), name, ttl=TTL)
    out, killed = kill_trial(holder, contender, group.kill_primary, ERRORS)
    if not out["refused"]:
        group.wait_promoted(killed)
        group.restart_node(killed)
        group.wait_stable(timeout=60, settle=SETTLE)
    return out


def partition_trial(group: SentinelGroup, min_replicas: int) -> dict[str, Any]:
    """The old primary wakes up after a failover; a holder still connected to it asks."""
    name = f"partition-{secrets.token_hex(4)}"
    stale_client = group.master_client(**CLIENT)
    stale_client.ping()  # a pooled connection to the primary, as a busy worker has
    holder = RedisLock(
        stale_client, name, ttl=TTL, min_replicas=min_replicas, replica_timeout=REPLICA_TIMEOUT
    )
    contender = RedisLock(group.master_client(**CLIENT), name, ttl=60)
    old = group.primary_port()
    assert old is not None
    group.pause_node(old)
    group.wait_promoted(old)
    group.resume_node(old)
    out: dict[str, Any] = {"refused": False}
    try:
        stale = holder.acquire(blocking=False)  # the old primary, not yet demoted
    except NotReplicated:
        stale, out["refused"] = None, True
    except (redis.ConnectionError, redis.TimeoutError):
        stale = None  # demoted already: the client moved to the new primary
    second = until_answered(
        lambda: contender.acquire(blocking=False), time.monotonic() + 30, ERRORS
    )
    out["double"] = stale is not None and second is not None
    out["granted_old"] = stale is not None
    resumed = time.monotonic()
    deadline = resumed + 20
    while group.role(old) != "slave" and time.monotonic() < deadline:
        time.sleep(0.05)
    out["demoted_after"] = round(time.monotonic() - resumed, 2)
    if stale is not None:
        extended = until_answered(stale.extend, time.monotonic() + 30, ERRORS)
        out["lost"] = not extended and stale.lost
    else:
        out["lost"] = False
    out["new_intact"] = second is None or second.extend()
    if not out["new_intact"]:  # what the name looks like now, to explain it
        out["holders_now"] = [(h.token_hint, h.fence) for h in contender.info().holders]
        out["second"] = (second.token[:8], second.fence) if second is not None else None
    if second is not None:
        second.release()
    out["primary"] = (old, group.wait_stable(timeout=60, settle=SETTLE))
    return out


def report_partition(results: dict[str, list[dict[str, Any]]]) -> None:
    rows = [
        [
            mode,
            len(outs),
            sum(o["granted_old"] for o in outs),
            sum(o["refused"] for o in outs),
            sum(o["double"] for o in outs),
            sum(o["lost"] for o in outs),
            sum(not o["new_intact"] for o in outs),
        ]
        for mode, outs in results.items()
    ]
    print_table(
        [
            "partition: mode",
            "trials",
            "granted by the old primary",
            "refused (NotReplicated)",
            "double grants",
            "stale reported lost",
            "new holder disturbed",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per mode")
    parser.add_argument("--steady", type=int, default=500, help="steady-state rounds")
    parser.add_argument("--scenario", choices=("kill", "partition", "both"), default="both")
    args = parse_args(parser)
    # SIGTERM ends the run through the ``with`` block, so every server is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    partitions: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    runs = [(results, trial, "kill"), (partitions, partition_trial, "partition")]
    runs = [run for run in runs if args.scenario in (run[2], "both")]
    with SentinelGroup() as group:
        group.wait_stable()
        cost = steady_state(group, args.steady)
        started = time.monotonic()
        for i in range(args.trials):
            order = list(MODES)
            random.shuffle(order)
            for mode in order:
                for store, run, label in runs:
                    outcome = run(group, MODES[mode])
                    store[mode].append(outcome)
                    print(f"{label} {i + 1}/{args.trials} {mode}: {outcome}", flush=True)
        took = time.monotonic() - started
        version = group.node_client(group.wait_stable()).info("server")["redis_version"]
    print()
    print_table(
        ["steady state: mode", "acquire p50 µs", "vs no acks"],
        [[mode, f"{cost[mode]:.0f}", f"{cost[mode] / cost['no acks']:.2f}x"] for mode in MODES],
    )
    if any(results.values()):
        print()
        report_kill("kill: mode", results, cost)
    if any(partitions.values()):
        print()
        report_partition(partitions)
    trials = args.trials * len(MODES) * len(runs)
    print(
        f"\n{trials} trials in {took:.0f} s; redis-server {version}, "
        f"Python {platform.python_version()}, load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
