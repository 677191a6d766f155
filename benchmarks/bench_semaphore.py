"""Benchmark ``RedisSemaphore`` against a minimal Lua sorted-set semaphore (the floor).

Run from the repository root (about a minute; ``--quick`` for a smoke test)::

    python benchmarks/bench_semaphore.py

It starts a private ``redis-server`` (``celery_redislock.testing.RedisServer``) and
measures, for limit 3 and 8 workers each looping acquire -> hold 1 ms -> release,
first as 8 threads (one process, one shared client) and then as 8 processes:

* critical sections per second;
* wait p50 / p99: from calling acquire to holding the permit;
* fairness: max / min sections per worker (min 0: a worker starved);
* Redis commands per section (``INFO commandstats`` delta, counting the commands run
  inside Lua scripts too) beside client round trips per section;
* the most sections seen open at once (interval sweep; must never exceed 3).

Implementations: ``RedisSemaphore`` (fair=False, the default; fair=True; and, to show
the trade-off, fair=False without the starvation guard, so newcomers always barge in),
and the floor: one Lua script (``ZREMRANGEBYSCORE`` + ``ZCARD`` + ``ZADD``) to
acquire, a ``ZREM`` to release, waiters sleep-poll (1 ms and 10 ms). Finally the cost
of an idle waiter: one waiter blocked on a full semaphore, in commands per second.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import platform
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from unittest.mock import patch

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import command_calls, median, parse_args, percentile, print_table

from celery_redislock import RedisSemaphore
from celery_redislock.core import semaphore_scripts
from celery_redislock.testing import RedisServer

LIMIT, WORKERS, HOLD = 3, 8, 0.001
FLOOR_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""
IMPLS = [
    "RedisSemaphore",
    "RedisSemaphore fair",
    "RedisSemaphore barging",
    "floor, 1 ms poll",
    "floor, 10 ms poll",
]

Acquire = Callable[[float], Callable[[], object] | None]  # timeout -> release, or None
_sent = itertools.count()


class CountingConnection(redis.Connection):
    """A connection that counts the commands it sends (client round trips)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        next(_sent)
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def sent() -> int:
    """Commands sent so far by this process (reading it counts one: subtract it)."""
    return next(_sent)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


def make_acquire(impl: str, client: redis.Redis, name: str) -> Acquire:
    """A blocking acquire for ``impl`` on ``name``: returns the release function."""
    if impl.startswith("RedisSemaphore"):
        # "barging": not fair and no patience, newcomers always take a free permit.
        patience = 1e9 if impl.endswith("barging") else semaphore_scripts.PATIENCE_MS
        with patch.object(semaphore_scripts, "PATIENCE_MS", patience):
            sem = RedisSemaphore(client, name, limit=LIMIT, ttl=30, fair=impl.endswith("fair"))

        def acquire(timeout: float) -> Callable[[], object] | None:
            lease = sem.acquire(timeout=timeout)
            return None if lease is None else lease.release

        return acquire
    sha, poll = client.script_load(FLOOR_ACQUIRE), 0.001 if "1 ms" in impl else 0.01

    def floor(timeout: float) -> Callable[[], object] | None:
        token, deadline = secrets.token_hex(16), time.monotonic() + timeout
        while not client.evalsha(sha, 1, name, token, LIMIT, 30_000):
            if time.monotonic() > deadline:
                return None
            time.sleep(poll)
        return lambda: client.zrem(name, token)

    return floor


def section_loop(acquire: Acquire, duration: float) -> list[tuple[float, float, float]]:
    """(asked, acquired, released) in ``time.monotonic()`` for each section."""
    rows = []
    stop_at = time.monotonic() + duration
    while (asked := time.monotonic()) < stop_at:
        release = acquire(10.0)
        if release is None:
            break
        acquired = time.monotonic()
        time.sleep(HOLD)
        released = time.monotonic()
        release()
        rows.append((asked, acquired, released))
    return rows


def process_worker(impl: str, url: str, name: str, duration: float, barrier: Any, out: Any) -> None:
    client = counting_client(url)
    acquire = make_acquire(impl, client, name)
    client.ping()
    barrier.wait()
    before = sent()
    rows = section_loop(acquire, duration)
    out.put((rows, sent() - before - 1))
    client.close()


def run_threads(impl: str, url: str, name: str, duration: float) -> tuple[list[Any], int]:
    client = counting_client(url)
    acquire = make_acquire(impl, client, name)
    client.ping()
    per_worker: list[Any] = [[] for _ in range(WORKERS)]
    barrier = threading.Barrier(WORKERS + 1)

    def work(index: int) -> None:
        barrier.wait()
        per_worker[index] = section_loop(acquire, duration)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    before = sent()
    barrier.wait()
    for thread in threads:
        thread.join()
    trips = sent() - before - 1
    client.close()
    return per_worker, trips


def run_processes(impl: str, url: str, name: str, duration: float) -> tuple[list[Any], int]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(WORKERS + 1), ctx.Queue()
    procs = [
        ctx.Process(target=process_worker, args=(impl, url, name, duration, barrier, out))
        for _ in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=60)
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    return [rows for rows, _ in results], sum(trips for _, trips in results)


def max_open(rows: list[tuple[float, float, float]]) -> int:
    events = sorted([(a, 1) for _, a, _ in rows] + [(r, -1) for _, _, r in rows])
    return max(itertools.accumulate(step for _, step in events))


def measure(mode: str, impl: str, url: str, duration: float, admin: redis.Redis) -> dict[str, Any]:
    runner = run_threads if mode == "threads" else run_processes
    calls_before = command_calls(admin)
    per_worker, trips = runner(impl, url, f"bench:{mode}:{impl}:{secrets.token_hex(2)}", duration)
    calls = command_calls(admin) - calls_before - 1  # minus our own INFO
    rows = [row for worker in per_worker for row in worker]
    waits = [acquired - asked for asked, acquired, _ in rows]
    counts = [len(worker) for worker in per_worker]
    return {
        "rate": len(rows) / duration,
        "p50": percentile(waits, 50),
        "p99": percentile(waits, 99),
        "fair": max(counts) / max(1, min(counts)),
        "counts": f"{max(counts)}/{min(counts)}",
        "cmds": calls / len(rows),
        "trips": trips / len(rows),
        "open": max_open(rows),
    }


def contended(url: str, duration: float, rounds: int) -> list[list[str]]:
    """Every implementation once per round, in alternating order; medians over rounds."""
    admin = redis.Redis.from_url(url)
    table = []
    for mode in ("threads", "processes"):
        runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
        for round_no in range(rounds):
            for impl in IMPLS if round_no % 2 == 0 else reversed(IMPLS):
                runs[impl].append(measure(mode, impl, url, duration, admin))
        for impl, results in runs.items():
            mid = sorted(results, key=lambda r: r["rate"])[len(results) // 2]
            table.append(
                [
                    mode,
                    impl,
                    f"{median([r['rate'] for r in results]):.0f}",
                    f"{median([r['p50'] for r in results]) * 1000:.2f}",
                    f"{median([r['p99'] for r in results]) * 1000:.2f}",
                    mid["counts"],
                    f"{median([r['cmds'] for r in results]):.1f}",
                    f"{median([r['trips'] for r in results]):.2f}",
                    str(max(r["open"] for r in results)),
                ]
            )
    admin.close()
    return table


def idle_waiter(url: str, seconds: float) -> list[list[str]]:
    """Commands per second caused by one waiter blocked on a full semaphore.

    Counted over ``seconds`` of steady state: from one second after the waiter
    blocked (its set-up is left out) until ``seconds`` later.
    """
    admin = redis.Redis.from_url(url)
    table = []
    for impl in IMPLS:
        client = counting_client(url)
        name = f"bench:idle:{impl}"
        holder = make_acquire(impl, admin, name)
        releases = [holder(1.0) for _ in range(LIMIT)]
        acquire = make_acquire(impl, client, name)
        waiter = threading.Thread(target=acquire, args=(seconds + 2.0,))
        waiter.start()
        time.sleep(1.0)
        calls_before, before = command_calls(admin), sent()
        time.sleep(seconds)
        trips, calls = sent() - before - 1, command_calls(admin) - calls_before - 1
        waiter.join()
        for release in releases:
            assert release is not None
            release()
        table.append([impl, f"{calls / seconds:.1f}", f"{trips / seconds:.1f}"])
        client.close()
    admin.close()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter run (smoke test)")
    options = parse_args(parser)
    duration, rounds, idle = (1.0, 1, 2.0) if options.quick else (2.0, 3, 5.0)
    started = time.monotonic()
    with RedisServer() as server:
        info = redis.Redis.from_url(server.url).info("server")
        print(
            f"redis-server {info['redis_version']}, redis-py {redis.__version__}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        idle_table = idle_waiter(server.url, idle)  # first: no other client is around yet
        print(
            f"\nlimit {LIMIT}, {WORKERS} workers, {HOLD * 1000:g} ms hold; medians of "
            f"{rounds} round(s) of {duration:g} s; wait in ms:"
        )
        print_table(
            [
                "workers",
                "implementation",
                "sections/s",
                "wait p50",
                "wait p99",
                "max/min",
                "cmds/section",
                "round trips/section",
                "max open",
            ],
            contended(server.url, duration, rounds),
        )
        print(f"\nOne idle waiter blocked on a full semaphore, over {idle:g} s:")
        print_table(["implementation", "cmds/s", "round trips/s"], idle_table)
    print(f"\ntotal time {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
