"""Benchmark ``RedlockLock`` on 3 and 5 local masters beside pottery's ``Redlock`` and
our single-master ``RedisLock``.

pottery is not a dependency: install it in the benchmark's environment only::

    python3 -m venv /tmp/bench && /tmp/bench/bin/pip install -q pottery -e .
    /tmp/bench/bin/python benchmarks/bench_redlock.py [--quick]

Without pottery its rows are left out. It starts five private ``redis-server``s and
measures, interleaved round by round so a busy machine hits every side alike:

1. **Uncontended** acquire (non-blocking) + release, and a held lease's ``extend()``
   and ``extend(ttl, add=True)``, p50 / p99 per round, medians over rounds; the ratio
   to ``RedisLock`` is the median of the per-round p50 ratios; CPU per cycle of this
   client and of all the servers (INFO cpu), where the time goes;
   and their sum over the cores this process may run on ("CPU floor"): no cycle can
   be faster than that when the client and the servers share those cores, as on one
   machine (N masters do N times a master's work per cycle, mostly kernel time per
   request: wake-ups, loopback TCP).
2. **Contended hand-off**, 8 processes looping blocking acquire -> hold 1 ms ->
   release for a few seconds: the gap between one section's release and the next
   section's acquire returning (one clock: same machine), p50, and sections done.
3. **Fan-out choices** for the record: the lock scripts sent to 5 masters through a
   thread pool, through ``redis.asyncio`` driven from a sync call, and as
   ``RedlockLock`` sends them (a redis-py connection of its own per master: sent to
   all, then the replies read as they arrive, a round ended once a majority answered).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import median, parse_args, percentile, print_table

from celery_redislock import RedisLock, RedlockLock
from celery_redislock.core.redlock import rounds
from celery_redislock.testing import RedisServer

try:
    from pottery import Redlock
except ImportError:  # not a dependency: see the module docs
    Redlock = None

TTL = 10.0


def mark_booted(clients: list[redis.Redis], ttl: float) -> None:
    """Fresh private servers held no lease before: skip their restart grace."""
    for client in clients:
        run_id = client.info("server")["run_id"]
        client.set(f"redislock:redlock:boot:{run_id}:{round(ttl * 1000)}", 1)


def cycles(ports: list[int], n: int) -> dict[str, Callable[[], None]]:
    clients = [redis.Redis(port=port) for port in ports]
    single = RedisLock(clients[0], "bench-single", ttl=TTL)
    ours = RedlockLock(clients[:n], f"bench-{n}", ttl=TTL)

    def redis_lock() -> None:
        lease = single.acquire(blocking=False)
        assert lease is not None
        lease.release()

    def redlock() -> None:
        lease = ours.acquire(blocking=False)
        assert lease is not None
        lease.release()

    # Another lock's lease, extended every cycle (never expires meanwhile).
    held = RedlockLock(clients[:n], f"bench-held-{n}", ttl=TTL).acquire(blocking=False)
    assert held is not None

    def redlock_extend() -> None:
        assert held.extend()

    def redlock_add() -> None:
        assert held.extend(0.001, add=True)  # capped at max_ttl (the TTL) on the masters

    out = {
        "RedisLock (1 master)": redis_lock,
        f"RedlockLock ({n})": redlock,
        f"RedlockLock ({n}) extend()": redlock_extend,
        f"RedlockLock ({n}) extend(add=True)": redlock_add,
    }
    if Redlock is not None:
        theirs = Redlock(key=f"bench-pottery-{n}", masters=set(clients[:n]), auto_release_time=TTL)

        def pottery() -> None:
            assert theirs.acquire(blocking=False)
            theirs.release()

        out[f"pottery Redlock ({n})"] = pottery
    return out


def server_cpu(clients: list[redis.Redis]) -> float:
    """Seconds of CPU the servers used so far (user + system, INFO cpu)."""
    total = 0.0
    for client in clients:
        info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def uncontended(ports: list[int], n: int, rounds_: int, per_round: int) -> None:
    fns = cycles(ports, n)
    servers = [redis.Redis(port=port) for port in ports]
    samples: dict[str, list[list[float]]] = {name: [] for name in fns}
    cpu = {name: [0.0, 0.0] for name in fns}  # client, servers (s)
    for fn in fns.values():  # warm: connections, scripts
        for _ in range(200):
            fn()
    for _ in range(rounds_):
        for name, fn in fns.items():
            times = []
            client0, server0 = time.process_time(), server_cpu(servers)
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            cpu[name][0] += time.process_time() - client0
            cpu[name][1] += server_cpu(servers) - server0
            samples[name].append(times)
    base = "RedisLock (1 master)"
    rows = []
    count = rounds_ * per_round
    cores = len(os.sched_getaffinity(0))
    for name, per in samples.items():
        p50 = median([median(times) for times in per])
        p99 = median([percentile(times, 99) for times in per])
        ratio = median([median(t) / median(b) for t, b in zip(per, samples[base], strict=True)])
        client, servers_cpu = (seconds / count * 1e6 for seconds in cpu[name])
        floor = (client + servers_cpu) / cores
        rows.append(
            [
                name,
                f"{p50 * 1e6:.0f}",
                f"{p99 * 1e6:.0f}",
                f"{ratio:.2f}x",
                f"{client:.0f}",
                f"{servers_cpu:.0f}",
                f"{floor:.0f}",
            ]
        )
    print(
        f"\nUncontended acquire + release (extend: one held lease), {n} masters "
        f"({rounds_} rounds x {per_round})"
    )
    print_table(
        [
            "lock",
            "p50 µs",
            "p99 µs",
            "vs RedisLock",
            "client CPU µs",
            "servers' CPU µs",
            f"CPU floor µs ({cores} cores)",
        ],
        rows,
    )


def _worker(kind: str, ports: list[int], n: int, seconds: float, out: Any) -> None:
    clients = [redis.Redis(port=port) for port in ports[:n]]
    name = f"contended-{kind}-{n}"
    stop = time.time() + seconds
    spans = []
    if kind == "pottery":
        lock = Redlock(key=name, masters=set(clients), auto_release_time=TTL)
        while time.time() < stop:
            lock.acquire(blocking=True, timeout=5)
            got = time.time()
            time.sleep(0.001)
            done = time.time()
            lock.release()
            spans.append((got, done))
    else:
        ours: Any = (
            RedisLock(clients[0], name, ttl=TTL)
            if kind == "single"
            else RedlockLock(clients, name, ttl=TTL)
        )
        while time.time() < stop:
            lease = ours.acquire(timeout=5)
            got = time.time()
            time.sleep(0.001)
            done = time.time()
            lease.release()
            spans.append((got, done))
    out.put(spans)


def contended(ports: list[int], n: int, seconds: float) -> None:
    kinds = ["single", "redlock"] + (["pottery"] if Redlock is not None else [])
    labels = {
        "single": "RedisLock (1 master)",
        "redlock": f"RedlockLock ({n})",
        "pottery": f"pottery Redlock ({n})",
    }
    rows = []
    ctx = multiprocessing.get_context("fork")
    for kind in kinds:
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(kind, ports, n, seconds, queue)) for _ in range(8)
        ]
        for proc in procs:
            proc.start()
        spans = sorted(span for _ in procs for span in queue.get())
        for proc in procs:
            proc.join()
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
        rows.append(
            [
                labels[kind],
                f"{median(gaps) * 1e3:.2f}",
                f"{percentile(gaps, 99) * 1e3:.2f}",
                str(len(spans)),
            ]
        )
    print(f"\nContended hand-off, 8 processes, 1 ms hold, {seconds:.0f} s each, {n} masters")
    print_table(["lock", "hand-off p50 ms", "p99 ms", "sections"], rows)


def fan_out_choices(ports: list[int], count: int) -> None:
    clients = [redis.Redis(port=port) for port in ports]
    lock = RedlockLock(clients, "fan", ttl=TTL)
    keys = lock._scripts.acquire_keys
    pool = ThreadPoolExecutor(5)

    def threads() -> None:
        token = secrets.token_hex(16)
        list(pool.map(lambda c: rounds.ACQUIRE(c, keys, [token, 10000]), clients))
        keys_r = lock._scripts.release_call(token)
        list(pool.map(lambda c: rounds.RELEASE(c, keys_r, [token]), clients))

    loop = asyncio.new_event_loop()
    aclients = [redis.asyncio.Redis(port=port) for port in ports]

    async def both() -> None:
        token = secrets.token_hex(16)
        keys_r = lock._scripts.release_call(token)
        for script, ks, args in (
            (rounds.ACQUIRE, keys, [token, 10000]),
            (rounds.RELEASE, keys_r, [token]),
        ):
            await asyncio.gather(*(c.evalsha(script.sha, len(ks), *ks, *args) for c in aclients))

    def asyncio_client() -> None:
        loop.run_until_complete(both())

    def ours() -> None:
        lease = lock.acquire(blocking=False)
        assert lease is not None
        lease.release()

    for client in clients:
        client.script_load(rounds.ACQUIRE.text)
        client.script_load(rounds.RELEASE.text)
    for fn in (threads, asyncio_client, ours):
        for _ in range(100):
            fn()
    rows = []
    for name, fn in (
        ("thread pool", threads),
        ("redis.asyncio from a sync call", asyncio_client),
        ("RedlockLock", ours),
    ):
        times = []
        for _ in range(count):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        rows.append([name, f"{median(times) * 1e6:.0f}"])
    loop.close()
    print("\nFan-out of acquire + release to 5 masters")
    print_table(["how", "p50 µs"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument(
        "--uncontended", action="store_true", help="only the uncontended table (item 1)"
    )
    options = parse_args(parser)
    rounds_, per_round, seconds = (4, 100, 1.0) if options.quick else (12, 200, 3.0)
    if Redlock is None:
        print("pottery is not installed here: its rows are left out (see the module docs)")
    servers = [RedisServer().start() for _ in range(5)]
    try:
        ports = [server.port for server in servers]
        mark_booted([redis.Redis(port=port) for port in ports], TTL)
        for n in (3, 5):
            uncontended(ports, n, rounds_, per_round)
        if not options.uncontended:
            for n in (3, 5):
                contended(ports, n, seconds)
            fan_out_choices(ports, 300 if options.quick else 1000)
    finally:
        for server in servers:
            server.stop()
    print(f"\nload average {os.getloadavg()}")


if __name__ == "__main__":
    main()
