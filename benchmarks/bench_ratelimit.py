"""Benchmark ``RedisRateLimiter`` beside the ``limits`` library's moving window, on the
same private Redis, in one run (issue #25).

Run from the repository root (about 40 s; ``--seconds 2`` for a quicker one)::

    python benchmarks/bench_ratelimit.py

Scenarios, each with 4 processes hammering one limiter of ``N/s`` (blocked callers
sleep until their admission: ours by the server's admission time, ``limits`` by its
``get_window_stats`` reset time, as its docs suggest), once with the processes' wall
clocks in step and once with them an hour apart (``time.time`` shifted by 0, +1 h,
-1 h, +30 min in the processes):

* max/window: the most admissions in any window of one period (must never exceed
  N). "server": an interval sweep over the server's own admission times (ours only:
  ``limits`` keeps none); "client": the most admissions that certainly fell in one
  window, from each admitting call's start and end on ``time.monotonic()`` (one clock
  for every process on the machine) -- a lower bound, fair to both;
* % of N: admissions per whole period, as a share of N (saturation throughput);
* Redis commands per admission (``INFO commandstats``, counting those run in Lua).

Then the cost per call, uncontended (one process, a limit never reached): client µs per
call and the server's µs per call (``usec_per_call`` of the commands it ran).
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import sys
import time
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import add_to_dump, command_calls, parse_args, print_table
from celery_redislock import RedisRateLimiter
from celery_redislock.testing import RedisServer

spawn = multiprocessing.get_context("spawn")
SHIFTS = {
    "clocks in step": [0.0, 0.0, 0.0, 0.0],
    "clocks 1 h apart": [0.0, 3600.0, -3600.0, 1800.0],
}


def worker(
    kind: str, url: str, key: str, limit: int, seconds: float, shift: float, go: Any, out: Any
) -> None:
    """Admit as fast as allowed for ``seconds``; report, per admission, the client's
    ``time.monotonic()`` before and after the call that admitted it, and the server's
    admission time (ours only; nan for ``limits``)."""
    if shift:
        wall = time.time
        time.time = lambda: wall() + shift  # type: ignore[assignment]
    rows: list[tuple[float, float, float]] = []
    if kind == "ours":
        client = redis.Redis.from_url(url)
        limiter = RedisRateLimiter(client, key, rate=f"{limit}/s")
        limiter.retry_after()
        go.wait(30)
        end = time.monotonic() + seconds
        # The admitting call began when acquire() began or when its last sleep ended.
        woke = [0.0]
        sleep = time.sleep

        def marked_sleep(seconds: float) -> None:
            sleep(seconds)
            woke[0] = time.monotonic()

        time.sleep = marked_sleep
        while (left := end - time.monotonic()) > 0:
            started = time.monotonic()
            if not limiter.acquire(timeout=left):
                break
            admission = limiter.last_admission
            assert admission is not None
            rows.append((max(started, woke[0]), time.monotonic(), admission.at))
    else:
        from limits import parse, storage, strategies

        store = storage.RedisStorage(url)
        moving = strategies.MovingWindowRateLimiter(store)
        item = parse(f"{limit}/second")
        moving.get_window_stats(item, key)
        go.wait(30)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            if moving.hit(item, key):
                rows.append((started, time.monotonic(), float("nan")))
                continue
            stats = moving.get_window_stats(item, key)
            time.sleep(
                min(max(stats.reset_time - time.time(), 0.001), max(0.0, end - time.monotonic()))
            )
    out.put(rows)


def most_in_a_window(times: list[float], period: float) -> int:
    """The most admissions in any half-open window [t, t + period)."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + period) - i for i, t in enumerate(times)), default=0)


def surely_in_a_window(calls: list[tuple[float, float]], period: float) -> int:
    """The most admissions that certainly fell in one window of ``period``: each
    happened between its call's start and end (client clock), so those whose calls
    started at or after ``s`` and ended before ``s + period`` lie in [s, s + period)."""
    calls = sorted(calls)
    best = 0
    for i, (start, _) in enumerate(calls):
        best = max(best, sum(1 for _, end in calls[i:] if end < start + period))
    return best


def scenario(
    kind: str,
    url: str,
    key: str,
    limit: int,
    seconds: float,
    shifts: list[float],
    record: list[tuple[float, float, float]] | None = None,
) -> list[object]:
    client = redis.Redis.from_url(url)
    go, out = spawn.Event(), spawn.Queue()
    procs = [
        spawn.Process(target=worker, args=(kind, url, key, limit, seconds, s, go, out))
        for s in shifts
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0)
    before = command_calls(client)
    go.set()
    rows = [row for _ in procs for row in out.get(timeout=120)]
    if record is not None:  # --dump: every admission's call (start, end) and server time
        record.extend(rows)
    commands = command_calls(client) - before
    for proc in procs:
        proc.join(30)
    client.close()
    local = sorted(row[1] for row in rows)
    span = local[-1] - local[0] if len(local) > 1 else 0.0
    whole = max(1, int(span))
    share = sum(1 for t in local if t < local[0] + whole) / (limit * whole)
    server = [row[2] for row in rows if row[2] == row[2]]
    return [
        len(rows),
        most_in_a_window(server, 1.0) if server else "-",
        surely_in_a_window([(row[0], row[1]) for row in rows], 1.0),
        f"{100 * share:.1f}",
        f"{commands / max(1, len(rows)):.1f}",
    ]


def cost_per_call(kind: str, url: str, calls: int) -> list[object]:
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    if kind == "ours":
        limiter = RedisRateLimiter(client, f"cost-{kind}", rate="1000000000/s")
        call: Any = limiter.acquire
    else:
        from limits import parse, storage, strategies

        moving = strategies.MovingWindowRateLimiter(storage.RedisStorage(url))
        item = parse("1000000000/second")

        def call() -> bool:
            return moving.hit(item, f"cost-{kind}")

    for _ in range(200):
        call()
    client.config_resetstat()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - started
    stats = client.info("commandstats")
    # The scripts' own time (it includes the commands they run, which INFO counts again).
    server_us = sum(
        float(stats.get(n, {}).get("usec", 0)) for n in ("cmdstat_evalsha", "cmdstat_eval")
    )
    client.close()
    return [f"{elapsed / calls * 1e6:.0f}", f"{server_us / calls:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per scenario")
    parser.add_argument("--limit", type=int, default=50, help="N of the N/s rate")
    parser.add_argument("--calls", type=int, default=3000, help="calls for the cost per call")
    args = parse_args(parser)
    admissions: dict[str, list[tuple[float, float, float]]] = {}
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}")
    with RedisServer() as server:
        rows = []
        for label, shifts in SHIFTS.items():
            for kind in ("ours", "limits"):
                name = "RedisRateLimiter" if kind == "ours" else "limits moving window"
                key = f"{kind}-{label.split()[1]}"
                record = admissions.setdefault(f"{name}, {label}", [])
                result = scenario(kind, server.url, key, args.limit, args.seconds, shifts, record)
                rows.append([f"{name}, {label}", *result])
        print(f"\n4 processes, {args.limit}/s, {args.seconds:g} s each (N = {args.limit})")
        print_table(
            [
                "limiter",
                "admitted",
                "max/window (server)",
                "max/window (client)",
                "% of N",
                "cmds/adm",
            ],
            rows,
        )
        costs = [
            ["RedisRateLimiter.acquire", *cost_per_call("ours", server.url, args.calls)],
            [
                "limits MovingWindowRateLimiter.hit",
                *cost_per_call("limits", server.url, args.calls),
            ],
        ]
        print(f"\nCost per call, uncontended, {args.calls} calls")
        print_table(["call", "client µs/call", "server µs/call"], costs)
    with open("/proc/loadavg") as f:
        print(f"\nload average after: {f.read().split()[:3]}")
    if args.dump:
        add_to_dump(
            limit=args.limit,
            period=1.0,
            # (call start, call end) on the shared monotonic clock; the server's
            # admission time (None for limits, which records none)
            admissions={
                label: [(a, b, None if c != c else c) for a, b, c in rows]
                for label, rows in admissions.items()
            },
        )


if __name__ == "__main__":
    main()
