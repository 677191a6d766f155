"""Benchmark ``RedisLock`` against a raw floor and redis-py's own ``Lock``.

Run from the repository root (takes well under two minutes)::

    python benchmarks/bench_lock.py            # full run
    python benchmarks/bench_lock.py --quick    # shorter, for a smoke test

It starts a private ``redis-server`` (``celery_redislock.testing.RedisServer``) on a
free loopback port and measures:

1. **Uncontended** acquire + release latency, p50 / p99, of

   * the *floor*: ``SET key token NX PX`` then a compare-and-delete Lua script by
     ``EVALSHA`` (the least a correct token lock can do: two round trips);
   * redis-py's ``redis.lock.Lock``;
   * ``RedisLock``;

   interleaved cycle by cycle (the order rotating) in several rounds, medians over
   rounds reported. The ratio to the floor is the median of the per-round ratios
   of p50, so drift of the machine's speed cancels. "Redis CPU" is redis-server's
   own CPU time per cycle (``INFO cpu``, the median of batches taken in turn after
   the rounds, see :func:`server_costs`): the part of a cycle the client cannot save
   (a loaded machine inflates it); "cmds" the Redis commands per cycle, those run
   inside Lua included.

2. **Contended hand-off**: 8 threads (one process, one shared client), then 8
   processes, each looping acquire -> hold 1 ms -> release. Every section records
   ``time.time()`` right after ``acquire`` returned and right before ``release`` was
   called; the hand-off latency is the gap between one section's release and the
   next section's acquire returning (same machine, so one clock). Also reported:
   fairness (max / min sections per worker; min 0 means a worker starved) and
   Redis commands per critical section (``INFO commandstats`` delta, which counts
   the commands run inside Lua scripts too) beside client round trips per section.
   redis-py's ``Lock`` (blocking, its default 0.1 s sleep) runs the same loops; as it
   lets the releasing worker barge straight back in, most of its hand-offs go to the
   same worker, so the p50 of hand-offs *to another worker* is shown too.

The figures depend on the machine: run it on an otherwise idle one (the load average
is printed at the end).
"""

from __future__ import annotations

import argparse
import gc
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

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import add_to_dump, command_calls, median, parse_args, percentile, print_table, us

from celery_redislock import RedisLock
from celery_redislock.testing import RedisServer

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

WORKERS = 8
HOLD = 0.001
WARMUP = 0.3  # seconds of each contended run left out of latency figures

# -- uncontended ------------------------------------------------------------------


def floor_cycle(client: redis.Redis) -> Callable[[], None]:
    sha = client.script_load(COMPARE_AND_DELETE)
    key = "bench:floor"

    def cycle() -> None:
        token = secrets.token_hex(16)
        if not client.set(key, token, nx=True, px=30_000):
            raise RuntimeError("floor lock unexpectedly held")
        client.evalsha(sha, 1, key, token)

    return cycle


def redispy_cycle(client: redis.Redis) -> Callable[[], None]:
    lock = client.lock("bench:redis-py", timeout=30)

    def cycle() -> None:
        if not lock.acquire():
            raise RuntimeError("redis-py lock not acquired")
        lock.release()

    return cycle


def redislock_cycle(client: redis.Redis) -> Callable[[], None]:
    lock = RedisLock(client, "bench:redislock", ttl=30)

    def cycle() -> None:
        lease = lock.acquire()
        assert lease is not None
        if not lease.release():
            raise RuntimeError("RedisLock lease lost")

    return cycle


def redislock_per_call_cycle(client: redis.Redis) -> Callable[[], None]:
    """``with RedisLock(client, f"user:{uid}")``: a lock object built per acquire."""
    uids = itertools.count()

    def cycle() -> None:
        with RedisLock(client, f"bench:user:{next(uids) % 1000}", ttl=30):
            pass

    return cycle


def redispy_per_call_cycle(client: redis.Redis) -> Callable[[], None]:
    uids = itertools.count()

    def cycle() -> None:
        lock = client.lock(f"bench:redis-py:user:{next(uids) % 1000}", timeout=30)
        if not lock.acquire():
            raise RuntimeError("redis-py lock not acquired")
        lock.release()

    return cycle


UNCONTENDED: dict[str, Callable[[redis.Redis], Callable[[], None]]] = {
    "floor (SET NX PX + EVALSHA del)": floor_cycle,
    "redis-py Lock": redispy_cycle,
    "RedisLock": redislock_cycle,
    "redis-py Lock, built per acquire": redispy_per_call_cycle,
    "RedisLock, built per acquire": redislock_per_call_cycle,
}


def measure(cycle: Callable[[], None], n: int) -> list[float]:
    clock = time.perf_counter
    samples = []
    for _ in range(n):
        start = clock()
        cycle()
        samples.append(clock() - start)
    return samples


def interleaved(cycles: dict[str, Callable[[], None]], n: int) -> dict[str, list[float]]:
    """``n`` cycles of each implementation, taken in turn (the order rotating), so
    that every implementation meets the same moment-to-moment machine conditions."""
    clock = time.perf_counter
    names = list(cycles)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            cycle = cycles[name]
            start = clock()
            cycle()
            samples[name].append(clock() - start)
    return samples


def server_costs(
    client: redis.Redis, cycles: dict[str, Callable[[], None]], n: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Per implementation: redis-server CPU seconds per cycle (user + system, ``INFO
    cpu``) and Redis commands per cycle (``INFO commandstats``, which counts the
    commands run inside Lua too). Measured in ``rounds`` batches of ``n`` cycles, the
    implementations in turn (the order rotating), the median batch reported: one
    batch of each run after another lets the machine's load (and the done keys of
    earlier cycles expiring) fall on whichever ran last. On a loaded machine a slower
    cycle also costs Redis more kernel time per cycle (each request wakes it from
    ``epoll_wait``), so the CPU column moves with the latency; the command count is
    exact and tells whether an implementation sends more."""

    def used() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    names = list(cycles)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    calls: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            cycle = cycles[name]
            calls_before, before = command_calls(client), used()
            for _ in range(n):
                cycle()
            after, calls_after = used(), command_calls(client)
            cpu[name].append((after - before) / n)
            calls[name].append((calls_after - calls_before - 3) / n)  # minus the 3 INFO
    return {name: (median(cpu[name]), median(calls[name])) for name in names}


def uncontended(
    url: str, rounds: int, n: int, keep: dict[str, list[float]] | None = None
) -> tuple[list[list[str]], dict[str, float]]:
    client = redis.Redis.from_url(url)
    cycles = {name: make(client) for name, make in UNCONTENDED.items()}
    for cycle in cycles.values():
        measure(cycle, n // 4)  # warm up: connections, script cache
    p50s: dict[str, list[float]] = {name: [] for name in cycles}
    p99s: dict[str, list[float]] = {name: [] for name in cycles}
    means: dict[str, list[float]] = {name: [] for name in cycles}
    order = list(cycles)
    for round_no in range(rounds):
        gc.collect()
        gc.disable()
        try:
            ordered = order if round_no % 2 == 0 else order[::-1]
            samples = interleaved({name: cycles[name] for name in ordered}, n)
        finally:
            gc.enable()
        for name in order:
            if keep is not None:  # --dump: every cycle's time, for the figures (#28)
                keep.setdefault(name, []).extend(samples[name])
            p50s[name].append(percentile(samples[name], 50))
            p99s[name].append(percentile(samples[name], 99))
            means[name].append(sum(samples[name]) / n)
    server = server_costs(client, cycles, max(50, n // 4), rounds * 2)
    floor = order[0]
    rows = []
    ratio_of: dict[str, float] = {}
    for name in order:
        ratios = [a / b for a, b in zip(p50s[name], p50s[floor], strict=True)]
        ratio = ratio_of[name] = median(ratios)
        rows.append(
            [
                name,
                us(median(p50s[name])),
                us(median(p99s[name])),
                us(median(means[name])),
                f"{ratio:.3f}x",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                us(server[name][0]),
                f"{server[name][1]:.1f}",
            ]
        )
    client.close()
    return rows, ratio_of


# -- contended --------------------------------------------------------------------

_sent = itertools.count()


class CountingConnection(redis.Connection):
    """A connection that counts the commands it sends (client round trips)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        next(_sent)
        super().send_packed_command(command, check_health)


def sent_so_far() -> int:
    return next(_sent)  # itertools.count: read by taking one (the caller subtracts)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


def make_acquirer(
    impl: str, client: redis.Redis, name: str
) -> Callable[[], Callable[[], None] | None]:
    """A function that blocks for the lock and returns its release function."""
    if impl == "RedisLock":
        lock = RedisLock(client, name, ttl=30)

        def acquire() -> Callable[[], None] | None:
            lease = lock.acquire(timeout=10)
            return None if lease is None else lease.release

        return acquire

    def acquire_redispy() -> Callable[[], None] | None:
        lock = client.lock(name, timeout=30, sleep=0.1, blocking=True, blocking_timeout=10)
        if not lock.acquire():
            return None
        return lock.release

    return acquire_redispy


Section = tuple[float, float, int]  # (acquired, released, worker index)


def section_loop(
    acquire: Callable[[], Callable[[], None] | None], duration: float, index: int
) -> list[Section]:
    sections: list[Section] = []
    stop_at = time.time() + duration
    while time.time() < stop_at:
        release = acquire()
        if release is None:
            break  # timed out: shows up as too few sections for this worker
        acquired = time.time()
        time.sleep(HOLD)
        released = time.time()
        release()
        sections.append((acquired, released, index))
    return sections


def process_worker(
    impl: str, url: str, name: str, duration: float, barrier: Any, results: Any, index: int
) -> None:
    client = counting_client(url)
    acquire = make_acquirer(impl, client, name)
    client.ping()
    barrier.wait()
    before = sent_so_far()
    sections = section_loop(acquire, duration, index)
    results.put((index, sections, sent_so_far() - before - 1))
    client.close()


def run_threads(impl: str, url: str, name: str, duration: float) -> tuple[list[Any], int]:
    client = counting_client(url)
    acquire = make_acquirer(impl, client, name)
    client.ping()
    per_worker: list[list[Section]] = [[] for _ in range(WORKERS)]
    barrier = threading.Barrier(WORKERS + 1)

    def work(index: int) -> None:
        barrier.wait()
        per_worker[index] = section_loop(acquire, duration, index)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    before = sent_so_far()
    barrier.wait()
    for thread in threads:
        thread.join()
    trips = sent_so_far() - before - 1
    client.close()
    return per_worker, trips


def run_processes(impl: str, url: str, name: str, duration: float) -> tuple[list[Any], int]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=process_worker, args=(impl, url, name, duration, barrier, results, i))
        for i in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=60)
    per_worker: list[list[Section]] = [[] for _ in range(WORKERS)]
    trips = 0
    for _ in procs:
        index, sections, sent = results.get(timeout=60)
        per_worker[index] = sections
        trips += sent
    for proc in procs:
        proc.join(10)
    return per_worker, trips


def contended(url: str, duration: float) -> tuple[list[list[str]], list[tuple[str, float, int]]]:
    admin = redis.Redis.from_url(url)
    rows = []
    verdicts = []
    for mode, runner in (("8 threads", run_threads), ("8 processes", run_processes)):
        for impl in ("RedisLock", "redis-py Lock"):
            name = f"bench:contended:{mode}:{impl}"
            calls_before = command_calls(admin)
            per_worker, trips = runner(impl, url, name, duration)
            calls = command_calls(admin) - calls_before - 1  # minus our own INFO
            sections = sorted(s for worker in per_worker for s in worker)
            overlaps = sum(1 for a, b in itertools.pairwise(sections) if b[0] < a[1])
            start = min(s[0] for s in sections)
            pairs = [(a, b) for a, b in itertools.pairwise(sections) if a[1] >= start + WARMUP]
            handoffs = [b[0] - a[1] for a, b in pairs]
            to_others = [b[0] - a[1] for a, b in pairs if a[2] != b[2]]
            counts = [len(w) for w in per_worker]
            fairness = f"{max(counts)}/{min(counts)}"
            p50 = percentile(handoffs, 50)
            share_to_others = 100 * len(to_others) // max(1, len(pairs))
            rows.append(
                [
                    mode,
                    impl,
                    str(len(sections)),
                    us(p50),
                    us(percentile(handoffs, 99)),
                    f"{us(percentile(to_others, 50))} ({share_to_others}%)",
                    fairness,
                    f"{calls / len(sections):.1f}",
                    f"{trips / len(sections):.1f}",
                    str(overlaps),
                ]
            )
            if impl == "RedisLock":
                verdicts.append((mode, p50, min(counts)))
    admin.close()
    return rows, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter run (smoke test)")
    options = parse_args(parser)
    kept: dict[str, list[float]] | None = {} if options.dump else None
    rounds, n, duration = (4, 400, 1.0) if options.quick else (8, 1500, 3.0)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with RedisServer() as server:
        info = redis.Redis.from_url(server.url).info("server")
        print(
            f"redis-server {info['redis_version']}, redis-py {redis.__version__}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.machine()}"
        )
        print(f"\nUncontended acquire + release, {rounds} rounds x {n} cycles (µs):")
        rows, ratios = uncontended(server.url, rounds, n, kept)
        print_table(
            ["implementation", "p50", "p99", "mean", "p50 / floor", "range", "Redis CPU", "cmds"],
            rows,
        )

        print(
            f"\nContended hand-off, {WORKERS} workers, {HOLD * 1000:g} ms hold, "
            f"{duration:g} s per run (µs):"
        )
        rows_c, verdicts = contended(server.url, duration)
        print_table(
            [
                "workers",
                "implementation",
                "sections",
                "hand-off p50",
                "p99",
                "p50 to another worker (share)",
                "max/min",
                "cmds/section",
                "round trips/section",
                "overlaps",
            ],
            rows_c,
        )
    print("\nTargets:")
    for name in ("RedisLock", "RedisLock, built per acquire"):
        ratio = ratios[name]
        print(
            f"  {name}: uncontended p50 within 1.15x of floor: {ratio:.3f}x "
            f"{'PASS' if ratio <= 1.15 else 'FAIL'}"
        )
    for mode, p50, least in verdicts:
        print(
            f"  {mode}: hand-off p50 {p50 * 1000:.3f} ms < 1 ms "
            f"{'PASS' if p50 < 0.001 else 'FAIL'}; every worker got the lock "
            f"(min {least}) {'PASS' if least > 0 else 'FAIL'}"
        )
    print(
        f"\ntotal time {time.monotonic() - started:.1f} s; load average (1 min) "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    if options.dump:
        # the distribution in 1,001 quantiles (0, 0.1 %, ..., 100 %) of every cycle
        ordered = {name: sorted(times) for name, times in (kept or {}).items()}
        quantiles = {
            name: [times[round(q * (len(times) - 1) / 1000)] for q in range(1001)]
            for name, times in ordered.items()
        }
        add_to_dump(unit="s", uncontended=quantiles)


if __name__ == "__main__":
    main()
