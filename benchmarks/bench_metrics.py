"""The hot-path cost of counting (#27): ``bench_singleton`` and ``bench_lock`` with
``redislock_metrics`` off and on, in blocks taken in turn, in one run.

Run from the repository root::

    python benchmarks/bench_metrics.py --rounds 10 --calls 100

**Singleton.** One private ``redis-server`` and one in-process worker (solo pool,
as ``bench_singleton``) run a plain task and a ``SingletonTask`` with the same
trivial body, called sequentially (``delay`` -> result), the two interleaved call by
call. Each round runs one block of ``--calls`` calls of each with counting off and
one with it on, the order alternating round by round; the setting is read per event,
so one worker serves both and only the setting differs. Everything counted is sent
(``flush``) before a block starts, so no block pays for the one before it. A block's
figure is the singleton's p50 over the plain task's p50 in that block (the machine's
drift cancels), and the singleton's p50 minus the plain one's (what the guards cost,
in µs).

**Receivers.** The three signals a singleton call sends (the grant at enqueue, the
run's adoption, the release) sent ``--signals`` times in a row, with counting off and
on in blocks taken in turn: what the metrics' receivers add to a call, in µs, without
the round trips around it (the recorder's thread sends meanwhile, as in a worker).

**Lock.** ``bench_lock``'s uncontended ``RedisLock`` acquire + release against its
floor (``SET NX PX`` + ``EVALSHA`` delete), in blocks labelled off and on in the same
turns. The core counts nothing (no module under ``celery_redislock/core`` imports the
metrics), so this is an A/A comparison: its spread is the noise of the method.

Reported: every block, then per setting the median and the range of the blocks,
and the Redis commands per singleton call (``INFO commandstats``, Lua's included).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis
from _common import command_calls, median, parse_args, print_table
from bench_lock import floor_cycle, interleaved, redislock_cycle
from bench_singleton import make_app
from celery.contrib.testing.worker import start_worker

from celery_redislock import SingletonTask
from celery_redislock.celery.metrics import flush
from celery_redislock.celery.signals import singleton_acquired, singleton_released
from celery_redislock.testing import RedisServer

SETTINGS = (False, True)


def _order(round_no: int) -> tuple[bool, ...]:
    return SETTINGS if round_no % 2 == 0 else SETTINGS[::-1]


def singleton_blocks(
    base: str, rounds: int, calls: int
) -> dict[bool, list[tuple[float, float, float]]]:
    """Per setting, each block's (singleton p50 / plain p50, singleton p50 - plain p50
    in µs, Redis commands per singleton call)."""
    app = make_app(base)

    @app.task(name="bench.plain", shared=False)
    def plain(key: str) -> str:
        return key

    @app.task(name="bench.singleton", base=SingletonTask, shared=False)
    def single(key: str) -> str:
        return key

    admin = redis.Redis.from_url(f"{base}/0")
    blocks: dict[bool, list[tuple[float, float, float]]] = {on: [] for on in SETTINGS}
    with start_worker(
        app, pool="solo", concurrency=1, perform_ping_check=False, loglevel="WARNING"
    ):
        for on in SETTINGS:  # warm-up of both: connections, scripts, the recorder
            app.conf.redislock_metrics = on
            for _ in range(20):
                plain.delay("user-42").get(timeout=10)
                single.delay("user-42").get(timeout=10)
        for round_no in range(rounds):
            for on in _order(round_no):
                app.conf.redislock_metrics = on
                flush(10)
                times: dict[str, list[float]] = {"plain": [], "singleton": []}
                commands = 0
                for i in range(calls):
                    pair = [("plain", plain), ("singleton", single)]
                    for label, task in pair if i % 2 == 0 else pair[::-1]:
                        before = command_calls(admin) if label == "singleton" else 0
                        start = time.perf_counter()
                        assert task.delay("user-42").get(timeout=10) == "user-42"
                        times[label].append(time.perf_counter() - start)
                        if label == "singleton":
                            commands += command_calls(admin) - before - 1  # INFO itself
                s50, p50 = median(times["singleton"]), median(times["plain"])
                blocks[on].append((s50 / p50, (s50 - p50) * 1e6, commands / calls))
        flush(10)
    admin.close()
    app.close()
    return blocks


def receiver_blocks(base: str, rounds: int, n: int) -> dict[bool, list[float]]:
    """Per setting, each block's µs per singleton call of the receivers' work."""
    app = make_app(base)

    @app.task(name="bench.singleton-signals", base=SingletonTask, shared=False)
    def single(key: str) -> str:
        return key

    task = app.tasks[single.name]

    def calls(count: int) -> float:
        start = time.perf_counter()
        for i in range(count):
            task_id = str(i)
            singleton_acquired.send(sender=task, task_id=task_id, key="k", stage="enqueue")
            singleton_acquired.send(sender=task, task_id=task_id, key="k", stage="run")
            singleton_released.send(
                sender=task, task_id=task_id, key="k", stage="run", reason="SUCCESS"
            )
        return (time.perf_counter() - start) / count * 1e6

    blocks: dict[bool, list[float]] = {on: [] for on in SETTINGS}
    for on in SETTINGS:
        app.conf.redislock_metrics = on
        calls(200)  # warm-up
    for round_no in range(rounds):
        for on in _order(round_no):
            app.conf.redislock_metrics = on
            flush(10)
            blocks[on].append(calls(n))
    flush(10)
    app.close()
    return blocks


def lock_blocks(url: str, rounds: int, cycles: int) -> dict[bool, list[float]]:
    """Per label, each block's RedisLock p50 / floor p50."""
    client = redis.Redis.from_url(url)
    impls = {"floor": floor_cycle(client), "RedisLock": redislock_cycle(client)}
    interleaved(impls, 200)  # warm-up
    blocks: dict[bool, list[float]] = {on: [] for on in SETTINGS}
    for round_no in range(rounds):
        for on in _order(round_no):
            samples = interleaved(impls, cycles)
            blocks[on].append(median(samples["RedisLock"]) / median(samples["floor"]))
    client.close()
    return blocks


def _label(on: bool) -> str:
    return "on" if on else "off"


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=100, help="calls of each task per block")
    parser.add_argument("--cycles", type=int, default=1000, help="lock cycles per block")
    parser.add_argument("--signals", type=int, default=3000, help="calls' signals per block")
    args = parse_args(parser)
    load_before = os.getloadavg()[0]
    with RedisServer() as server:
        base = server.url.rsplit("/", 1)[0]
        single = singleton_blocks(base, args.rounds, args.calls)
        receivers = receiver_blocks(base, args.rounds, args.signals)
        lock = lock_blocks(server.url, args.rounds, args.cycles)

    print(f"Singleton (solo pool, {args.calls} interleaved calls of each per block):")
    rows = []
    for round_no in range(args.rounds):
        for on in _order(round_no):
            ratio, extra, cmds = single[on][round_no]
            rows.append([round_no + 1, _label(on), f"{ratio:.3f}x", f"{extra:.0f}", f"{cmds:.1f}"])
    print_table(["round", "metrics", "p50 / plain", "p50 - plain us", "cmds/call"], rows)
    print(f"\nLock (uncontended, {args.cycles} interleaved cycles of each per block; A/A):")
    rows = [
        [round_no + 1, _label(on), f"{lock[on][round_no]:.3f}x"]
        for round_no in range(args.rounds)
        for on in _order(round_no)
    ]
    print_table(["round", "label", "RedisLock / floor"], rows)
    print("\nMedian (range) over the blocks:")
    summary = []
    for on in SETTINGS:
        summary.append(
            [
                _label(on),
                _spread([b[0] for b in single[on]], "{:.3f}x"),
                _spread([b[1] for b in single[on]], "{:.0f}"),
                f"{median([b[2] for b in single[on]]):.1f}",
                _spread(lock[on], "{:.3f}x"),
            ]
        )
    print_table(
        ["metrics", "singleton / plain", "singleton - plain us", "cmds/call", "lock / floor"],
        summary,
    )
    receiver_diffs = [on - off for on, off in zip(receivers[True], receivers[False], strict=True)]
    print(
        f"\nReceivers, µs per singleton call's three signals: off "
        f"{_spread(receivers[False], '{:.1f}')}, on {_spread(receivers[True], '{:.1f}')}; "
        f"on minus off, paired by round, {_spread(receiver_diffs, '{:+.1f}')}"
    )
    # Paired by round (the two blocks of a round ran back to back): on minus off.
    ratio_diffs = [on[0] - off[0] for on, off in zip(single[True], single[False], strict=True)]
    us_diffs = [on[1] - off[1] for on, off in zip(single[True], single[False], strict=True)]
    lock_diffs = [on - off for on, off in zip(lock[True], lock[False], strict=True)]
    print(
        "\nOn minus off, paired by round: singleton / plain "
        f"{_spread(ratio_diffs, '{:+.3f}')}x, higher in {sum(d > 0 for d in ratio_diffs)} "
        f"of {len(ratio_diffs)} rounds; singleton - plain {_spread(us_diffs, '{:+.0f}')} us; "
        f"lock / floor (A/A) {_spread(lock_diffs, '{:+.3f}')}x, higher in "
        f"{sum(d > 0 for d in lock_diffs)} of {len(lock_diffs)}"
    )
    print(
        f"\npython {platform.python_version()}, {platform.machine()}, "
        f"load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
