"""Benchmark one Prometheus scrape of the exporter (#27) over many held locks and pools.

Run from the repository root (well under a minute)::

    python benchmarks/bench_exporter.py                      # 10,000 locks, 100 pools
    python benchmarks/bench_exporter.py --locks 1000 --pools 10

It starts a private ``redis-server``, holds ``--locks`` locks (``RedisLock``) and
``--pools`` semaphores (2 of 3 permits held each) and 50 counter hashes, then times
``generate_latest`` of a registry holding ``RedisLockCollector`` (what ``/metrics``
serves): p50 / max over ``--scrapes`` scrapes, split into the counters, the SCAN
pass over the primitives and the pools' reads. The issue's target: under 200 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import median, parse_args, percentile, print_table

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.celery.metrics.collector import RedisLockCollector
from celery_redislock.celery.metrics.read import read_counters, read_state
from celery_redislock.celery.metrics.recorder import Recorder
from celery_redislock.testing import RedisServer


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def timed(fn: object, scrapes: int) -> list[float]:
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parse_args(parser)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        started = time.perf_counter()
        for i in range(args.locks):
            RedisLock(client, f"job:{i}", ttl=600).acquire(blocking=False)
        for i in range(args.pools):
            sem = RedisSemaphore(client, f"pool-{i}", limit=3, ttl=600)
            sem.acquire(blocking=False)
            sem.acquire(blocking=False)
        recorder = Recorder(client)
        for i in range(50):
            recorder.add("redislock", "lock", f"tasks.job{i}", "granted", hold=0.1)
        recorder.flush()
        setup = time.perf_counter() - started
        registry = CollectorRegistry(auto_describe=False)
        registry.register(RedisLockCollector(client, "redislock"))
        generate_latest(registry)  # warm: scripts loaded
        rows = []
        for label, fn in (
            ("whole scrape (/metrics)", lambda: generate_latest(registry)),
            ("counters", lambda: read_counters(client, "redislock")),
            ("gauges (SCAN + pools)", lambda: read_state(client, "redislock")),
        ):
            values = timed(fn, args.scrapes)
            rows.append(
                [
                    label,
                    args.scrapes,
                    ms(median(values)),
                    ms(percentile(values, 90)),
                    ms(max(values)),
                ]
            )
        keys = client.dbsize()
        client.close()
    print(
        f"one scrape, {args.locks} held locks, {args.pools} pools (2/3 held), 50 counter "
        f"hashes; {keys} keys in Redis (set up in {setup:.1f}s)\n"
    )
    print_table(["what", "runs", "p50 ms", "p90 ms", "max ms"], rows)
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().strip()
    print(f"\npython {platform.python_version()}, {platform.machine()}, /proc/loadavg: {load}")


if __name__ == "__main__":
    main()
