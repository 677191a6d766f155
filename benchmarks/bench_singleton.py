"""Benchmark a singleton task's ``delay`` -> result round trip against a plain task's.

Run from the repository root (well under a minute)::

    python benchmarks/bench_singleton.py              # 400 calls of each
    python benchmarks/bench_singleton.py --calls 100  # shorter, for a smoke test

It starts a private ``redis-server`` (``celery_redislock.testing.RedisServer``) that
holds the broker (db 1), the result backend (db 2) and the locks (db 3), and one
in-process worker (``celery.contrib.testing.worker.start_worker``) consuming both
tasks. The two tasks have the same trivial body; one is a plain ``@app.task``, the
other a ``SingletonTask`` (default mode ``until_done``: lock at enqueue, adoption and
renewal at start, release before the result is stored), always called with the same
argument, as a "refresh X" task is.

Calls are **interleaved** (plain, singleton, plain, ...; the order flips every pair)
and sequential, so drift and warm-up hit both alike. Reported: p50 / p90 / p99 of
each, the ratio of the medians (the issue's target: within 1.2x), and the Redis
commands per call (``INFO commandstats`` delta on the shared server, so it counts the
broker's and the backend's commands too).

The figures depend on the machine: run it on an otherwise idle one (the load average
is printed at the end).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis
from _common import command_calls, median, percentile, print_table, us
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redislock import SingletonTask
from celery_redislock.testing import RedisServer


def make_app(base: str) -> Celery:
    app = Celery("bench_singleton", set_as_current=False)
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{base}/2",
        redislock_url=f"{base}/3",
        task_default_queue="bench-singleton",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    return app


def run(calls: int, pool: str) -> None:
    with RedisServer() as server:
        base = server.url.rsplit("/", 1)[0]
        app = make_app(base)

        @app.task(name="bench.plain", shared=False)
        def plain(key: str) -> str:
            return key

        @app.task(name="bench.singleton", base=SingletonTask, shared=False)
        def single(key: str) -> str:
            return key

        admin = redis.Redis.from_url(f"{base}/0")
        with start_worker(app, pool=pool, concurrency=1, perform_ping_check=False,
                          loglevel="WARNING"):  # fmt: skip
            for task in (plain, single) * 20:  # warm-up: connections, scripts, renewer
                task.delay("user-42").get(timeout=10)
            times: dict[str, list[float]] = {"plain": [], "singleton": []}
            commands = {"plain": 0, "singleton": 0}
            for i in range(calls):
                pair: list[tuple[str, Any]] = [("plain", plain), ("singleton", single)]
                for label, task in pair if i % 2 == 0 else pair[::-1]:
                    before = command_calls(admin)
                    start = time.perf_counter()
                    assert task.delay("user-42").get(timeout=10) == "user-42"
                    times[label].append(time.perf_counter() - start)
                    commands[label] += command_calls(admin) - before - 1  # INFO itself
        admin.close()
        app.close()

    rows = []
    for label in ("plain", "singleton"):
        values = times[label]
        rows.append([label, len(values), us(percentile(values, 50)), us(percentile(values, 90)),
                     us(percentile(values, 99)), f"{commands[label] / calls:.1f}"])  # fmt: skip
    print(f"delay -> result round trip, {pool} pool, {calls} interleaved calls of each\n")
    print_table(["task", "calls", "p50 us", "p90 us", "p99 us", "Redis cmds/call"], rows)
    ratio = median(times["singleton"]) / median(times["plain"])
    print(f"\nsingleton / plain, ratio of medians: {ratio:.3f} (target <= 1.2)")
    print(f"python {platform.python_version()}, {platform.machine()}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls of each task")
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    args = parser.parse_args()
    run(args.calls, args.pool)


if __name__ == "__main__":
    main()
