"""Benchmark ``celery_redislock.asyncio`` beside redis.asyncio's ``Lock`` and a floor.

Run from the repository root::

    python benchmarks/bench_asyncio.py            # full run (about a minute)
    python benchmarks/bench_asyncio.py --quick    # shorter, for a smoke test

It starts a private ``redis-server`` and measures, all through ``redis.asyncio``:

1. **Uncontended** acquire + release, p50 / p99, of the *floor* (``SET key token NX
   PX`` then a compare-and-delete script by ``EVALSHA``: two round trips, the least a
   correct token lock can do), redis.asyncio's ``Lock`` and ``AsyncRedisLock`` (one
   lock object, and one built per acquire by ``async with``), interleaved cycle by
   cycle in several rounds; the ratio to the floor is the median of the per-round
   ratios of p50, so drift of the machine's speed cancels; then, in blocks of cycles,
   the client's and redis-server's CPU per cycle (``INFO cpu``), where a cycle's time
   goes. ``--uncontended`` runs this part only (``--rounds N``: more rounds).
2. **Hand-off**: 8 tasks in one loop, then 8 processes (one task each), looping
   acquire -> hold 1 ms -> release; the gap between one section's release and the
   next section's acquire returning, p50 / p99 (``time.time()``, one clock).
3. **API cap**: 1,000 tasks in one loop through an ``AsyncRedisSemaphore`` of limit
   10, each holding 5 ms once: throughput against the ideal (limit / hold), each
   task's wait p50 / p99, tasks that never got a permit, at most ``limit`` in at
   once, and Redis commands per section (``INFO commandstats``, counting those run
   inside scripts) beside client round trips per section, the CPU the client
   process and redis-server spent per section, and the time Redis spent running
   scripts per section. Where a permit's time goes, in ms (medians): how late a
   section ends after its hold (the loop's timer: epoll waits whole milliseconds) and
   the gap from one section's end to the start of the next on the permit it freed
   (release, grant and wake-up), each beside ``asyncio.Semaphore``'s. Throughput is
   taken over the steady part (from the first permit granted to the last section
   ended) and over the whole run (from the moment the 1,000 tasks were started).
   Each run is beside a run of the same sections through an ``asyncio.Semaphore``
   (no Redis): what the loop and the machine's load allow at best, so "ours /
   asyncio" compares within one run.
   ``--api-cap`` runs this part only (``--runs N``: 5 by default).

The figures depend on the machine (the load average is printed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import platform
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The package of the checkout this script is in (the venv's editable install may
# point at another checkout).
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import command_calls, median, parse_args, percentile, print_table, us

from celery_redislock.asyncio import AsyncRedisLock, AsyncRedisSemaphore
from celery_redislock.testing import RedisServer

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

Cycle = Callable[[], Awaitable[None]]

# -- uncontended ------------------------------------------------------------------


async def floor_cycle(client: aioredis.Redis) -> Cycle:
    sha = await client.script_load(COMPARE_AND_DELETE)

    async def cycle() -> None:
        token = secrets.token_hex(16)
        if not await client.set("bench:floor", token, nx=True, px=30_000):
            raise RuntimeError("floor key held")
        await client.evalsha(sha, 1, "bench:floor", token)

    return cycle


def redis_py_cycle(client: aioredis.Redis) -> Cycle:
    lock = client.lock("bench:redis-py", timeout=30)

    async def cycle() -> None:
        if not await lock.acquire(blocking=False):
            raise RuntimeError("redis-py lock held")
        await lock.release()

    return cycle


def ours_cycle(client: aioredis.Redis) -> Cycle:
    lock = AsyncRedisLock(client, "bench:ours", ttl=30)

    async def cycle() -> None:
        lease = await lock.acquire(blocking=False)
        if lease is None:
            raise RuntimeError("lock held")
        await lease.release()

    return cycle


def built_cycle(client: aioredis.Redis) -> Cycle:
    """The lock built per acquire, as users write it (``async with
    AsyncRedisLock(client, f"user:{uid}")``)."""

    async def cycle() -> None:
        async with AsyncRedisLock(client, "bench:built", ttl=30):
            pass

    return cycle


async def uncontended(url: str, rounds: int, cycles: int) -> list[list[object]]:
    client = aioredis.Redis.from_url(url)
    impls = {
        "floor (SET NX PX + EVALSHA del)": await floor_cycle(client),
        "redis.asyncio Lock": redis_py_cycle(client),
        "AsyncRedisLock": ours_cycle(client),
        "AsyncRedisLock built per acquire": built_cycle(client),
    }
    names = list(impls)
    per_round: dict[str, list[list[float]]] = {name: [] for name in names}
    for cycle in impls.values():  # warm up: scripts loaded, connections made
        for _ in range(200):
            await cycle()
    for round_no in range(rounds):
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(cycles):
            shift = (i + round_no) % len(names)
            order = names[shift:] + names[:shift]
            for name in order:
                started = time.perf_counter()
                await impls[name]()
                samples[name].append(time.perf_counter() - started)
        for name in names:
            per_round[name].append(samples[name])
    cpu = await cpu_per_cycle(url, impls, rounds, cycles)
    await client.aclose()
    floor = names[0]
    rows: list[list[object]] = []
    for name in names:
        every = [x for samples_ in per_round[name] for x in samples_]
        ratios = [median(per_round[name][i]) / median(per_round[floor][i]) for i in range(rounds)]
        rows.append(
            [
                name,
                us(median(every)),
                us(percentile(every, 99)),
                f"{median(ratios):.3f}x",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                us(cpu[name][0]),
                us(cpu[name][1]),
            ]
        )
    return rows


async def cpu_per_cycle(
    url: str, impls: dict[str, Cycle], rounds: int, cycles: int
) -> dict[str, tuple[float, float]]:
    """Each implementation's client CPU and redis-server CPU per cycle (seconds, the
    median of ``rounds`` blocks of ``cycles`` cycles, the order rotated per round):
    where a cycle's time goes."""
    sync = redis.Redis.from_url(url)
    names = list(impls)
    blocks: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_no in range(rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            client_cpu, server_cpu = time.process_time(), redis_cpu(sync)
            for _ in range(cycles):
                await impls[name]()
            blocks[name].append(
                (
                    (time.process_time() - client_cpu) / cycles,
                    (redis_cpu(sync) - server_cpu) / cycles,
                )
            )
    sync.close()
    return {
        name: (median([b[0] for b in blocks[name]]), median([b[1] for b in blocks[name]]))
        for name in names
    }


# -- hand-off ---------------------------------------------------------------------

HOLD = 0.001


async def sections(url: str, name: str, duration: float, tasks: int) -> list[tuple[float, float]]:
    client = aioredis.Redis.from_url(url)
    lock = AsyncRedisLock(client, name, ttl=10)
    rows: list[tuple[float, float]] = []
    stop_at = time.time() + duration

    async def task() -> None:
        while time.time() < stop_at:
            lease = await lock.acquire(timeout=10)
            assert lease is not None
            start = time.time()
            await asyncio.sleep(HOLD)
            end = time.time()
            await lease.release()
            rows.append((start, end))

    await asyncio.gather(*(task() for _ in range(tasks)))
    await client.aclose()
    return rows


def process_body(url: str, name: str, duration: float, go: Any, out: Any) -> None:
    go.wait(30)
    out.put(asyncio.run(sections(url, name, duration, 1)))


def handoffs(rows: list[tuple[float, float]], warmup: float) -> list[float]:
    ordered = sorted(rows)
    begin = ordered[0][0] + warmup
    return [b[0] - a[1] for a, b in itertools.pairwise(ordered) if a[1] >= begin]


def contended(url: str, duration: float) -> list[list[object]]:
    rows_out: list[list[object]] = []
    in_loop = asyncio.run(sections(url, "bench:tasks", duration, 8))
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Barrier(9), ctx.Queue()
    procs = [
        ctx.Process(target=process_body, args=(url, "bench:procs", duration, go, out))
        for _ in range(8)
    ]
    for proc in procs:
        proc.start()
    go.wait(30)
    per_proc = [out.get(timeout=duration + 60) for _ in procs]
    for proc in procs:
        proc.join(10)
    across = [row for rows in per_proc for row in rows]
    for label, rows in (("8 tasks, one loop", in_loop), ("8 processes", across)):
        gaps = handoffs(rows, 0.3)
        rows_out.append([label, len(rows), us(median(gaps)), us(percentile(gaps, 99))])
    return rows_out


# -- the API cap ------------------------------------------------------------------


async def api_cap(url: str, tasks: int, limit: int, hold: float) -> dict[str, float]:
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=64)
    client = aioredis.Redis(connection_pool=pool)
    sem = AsyncRedisSemaphore(client, f"bench:cap:{secrets.token_hex(4)}", limit=limit, ttl=30)
    sync = redis.Redis.from_url(url)
    inside = peak = 0
    waits: list[float] = []
    granted: list[float] = []
    ended: list[float] = []
    round_trips = 0
    original = sem._attempt

    async def counted(*args: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return await original(*args)

    sem._attempt = counted  # type: ignore[method-assign]

    async def task() -> None:
        nonlocal inside, peak, round_trips
        asked = time.monotonic()
        lease = await sem.acquire(timeout=60)
        if lease is None:
            return
        granted.append(time.monotonic())
        waits.append(granted[-1] - asked)
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(hold)
        inside -= 1
        ended.append(time.monotonic())
        round_trips += 1
        await lease.release()

    before, server_cpu, scripts = command_calls(sync), redis_cpu(sync), script_us(sync)
    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(task() for _ in range(tasks)))
    cpu = time.process_time() - cpu
    server_cpu = redis_cpu(sync) - server_cpu
    commands = command_calls(sync) - before - 1
    scripts = script_us(sync) - scripts
    await client.aclose()
    await pool.aclose()
    sync.close()
    done = len(ended)
    late, gap = slot_parts(granted, ended, limit, hold)
    return {
        "late": late,
        "gap": gap,
        "script us": scripts / done,
        "steady": done / (max(ended) - min(granted)) / (limit / hold),
        "whole": done / (max(ended) - started) / (limit / hold),
        "wait p50": median(waits) * 1000,
        "wait p99": percentile(waits, 99) * 1000,
        "starved": tasks - done,
        "peak": peak,
        "commands": commands / done,
        "round trips": round_trips / done,
        "cpu": cpu / done * 1000,
        "server cpu": server_cpu / done * 1000,
    }


def slot_parts(
    granted: list[float], ended: list[float], limit: int, hold: float
) -> tuple[float, float]:
    """Where a permit's time goes besides the hold, in ms (medians): how late a section
    ends after its hold (the loop's timer), and the gap from a section's end to the
    next section's start on the permit it freed (the ``i``-th end frees the permit of
    the ``i + limit``-th start: permits are handed on in order)."""
    starts, ends = sorted(granted), sorted(ended)
    late = [e - g - hold for g, e in zip(granted, ended, strict=True)]
    gaps = [starts[i + limit] - ends[i] for i in range(len(starts) - limit)]
    return median(late) * 1000, median(gaps) * 1000


def script_us(client: redis.Redis) -> float:
    """Microseconds redis-server spent running scripts so far (EVALSHA and EVAL)."""
    stats = client.info("commandstats")
    return sum(
        float(stats.get(name, {}).get("usec", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def redis_cpu(client: redis.Redis) -> float:
    """redis-server's CPU seconds so far (user + system)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def local_cap(tasks: int, limit: int, hold: float) -> dict[str, float]:
    """The same sections through an ``asyncio.Semaphore`` (no Redis): what this loop
    and this machine's load allow at best."""
    sem = asyncio.Semaphore(limit)
    granted: list[float] = []
    ended: list[float] = []

    async def task() -> None:
        async with sem:
            granted.append(time.monotonic())
            await asyncio.sleep(hold)
            ended.append(time.monotonic())

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(task() for _ in range(tasks)))
    late, gap = slot_parts(granted, ended, limit, hold)
    return {
        "late": late,
        "gap": gap,
        "steady": len(ended) / (max(ended) - min(granted)) / (limit / hold),
        "whole": len(ended) / (max(ended) - started) / (limit / hold),
        "cpu": (time.process_time() - cpu) / len(ended) * 1000,
    }


def api_caps(
    url: str, runs: int, tasks: int = 1000, limit: int = 10, hold: float = 0.005
) -> list[list[object]]:
    """``runs`` runs of the API cap, each beside a run of ``local_cap`` (alternating
    which goes first), one row each."""
    rows: list[list[object]] = []
    for run in range(runs):
        if run % 2:
            local = asyncio.run(local_cap(tasks, limit, hold))
        ours = asyncio.run(api_cap(url, tasks, limit, hold))
        if not run % 2:
            local = asyncio.run(local_cap(tasks, limit, hold))
        rows.append(
            [
                run + 1,
                f"{ours['steady']:.1%}",
                f"{ours['whole']:.1%}",
                f"{local['steady']:.1%}",
                f"{ours['steady'] / local['steady']:.2f}",
                f"{ours['wait p50']:.0f}",
                f"{ours['wait p99']:.0f}",
                int(ours["starved"]),
                int(ours["peak"]),
                f"{ours['commands']:.1f}",
                f"{ours['round trips']:.2f}",
                f"{ours['cpu']:.3f}",
                f"{ours['server cpu']:.3f}",
                f"{ours['script us']:.0f}",
                f"{ours['late']:.2f} / {local['late']:.2f}",
                f"{ours['gap']:.2f} / {local['gap']:.2f}",
            ]
        )
    return rows


def print_api_cap(url: str, runs: int) -> None:
    print(
        "\nAPI cap, AsyncRedisSemaphore, one loop: 1,000 tasks, limit 10, 5 ms holds "
        "(ideal 2,000 sections/s), each run beside asyncio.Semaphore(10) (no Redis):"
    )
    print_table(
        [
            "run",
            "steady (of ideal)",
            "whole run",
            "asyncio.Semaphore steady",
            "ours / asyncio",
            "wait p50 ms",
            "wait p99 ms",
            "starved",
            "max inside",
            "cmds/section",
            "round trips/section",
            "client CPU ms/section",
            "redis CPU ms/section",
            "script µs/section",
            "late ms (ours / asyncio)",
            "gap ms (ours / asyncio)",
        ],
        api_caps(url, runs),
    )
    print(
        "(a permit's cycle is the hold, how late its section ends (late) and the gap to "
        "the next section on it (gap): of ideal = hold / (hold + late + gap))"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter run (smoke test)")
    parser.add_argument("--uncontended", action="store_true", help="the uncontended cycle only")
    parser.add_argument("--rounds", type=int, help="rounds of the uncontended cycle")
    parser.add_argument("--api-cap", action="store_true", help="the API cap only")
    parser.add_argument("--runs", type=int, help="runs of the API cap")
    options = parse_args(parser)
    rounds, cycles, duration = (2, 200, 1.0) if options.quick else (5, 500, 2.0)
    rounds = options.rounds or rounds
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    with RedisServer() as server:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        print(
            f"redis-server {version}, redis-py {redis.__version__}, Python "
            f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
        )
        if options.api_cap:
            print_api_cap(server.url, options.runs or 5)
            print(
                f"\nload average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
            )
            return
        print(f"Uncontended acquire + release, {rounds} rounds x {cycles} cycles (µs):")
        print_table(
            [
                "implementation",
                "p50",
                "p99",
                "p50 / floor",
                "range",
                "client CPU/cycle",
                "redis CPU/cycle",
            ],
            asyncio.run(uncontended(server.url, rounds, cycles)),
        )
        if options.uncontended:
            print(
                f"\nload average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
            )
            return
        print(f"\nHand-off, AsyncRedisLock, 1 ms hold, {duration:g} s per run (µs):")
        print_table(["workers", "sections", "hand-off p50", "p99"], contended(server.url, duration))
        print_api_cap(server.url, options.runs or (2 if options.quick else 5))
    print(
        f"\ntotal time {time.monotonic() - began:.1f} s; load average (1 min) "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


if __name__ == "__main__":
    main()
