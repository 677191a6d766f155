"""Benchmark bounded concurrency: N short bounded tasks on 2 workers vs unbounded.

Run from the repository root (about half a minute)::

    python benchmarks/bench_bounded.py                 # 200 tasks of 50 ms, limit 3
    python benchmarks/bench_bounded.py --tasks 100 --duration 0.02 --rounds 1
    python benchmarks/bench_bounded.py --backlog      # 60 tasks of 0.2 s, limit 2:
                                      # parked vs re-publish vs plain Celery at
                                      # concurrency 2 (the control; _backlog.py)
    python benchmarks/bench_bounded.py --backlog --modes parked --stages
                                      # only the parked runs, each hand-off's stages timed

It starts a private ``redis-server`` (``celery_redislock.testing.RedisServer``) holding
the broker (db 1), the result backend (db 2) and the semaphores (db 3), writes the app
to a temporary module, and starts real ``celery worker`` subprocesses (prefork):

* **bounded**: ``@bounded_task(concurrency_limit=3)`` on 2 workers of concurrency 4
  (8 slots for 3 permits: 5 slots keep finding the pool full and re-schedule);
* **unbounded**: the same body as a plain task on 1 worker of concurrency 3 (total
  concurrency equal to the limit): the best a limit of 3 could possibly do.

Both bodies sleep ``--duration`` seconds and record their start and end in Redis.
Reported per round: the makespan (first send to last end), the ideal (tasks x
duration / limit), the peak concurrency (an interval sweep over the recorded runs:
it must equal the limit and never exceed it), "busy" (the share of the permits' time
spent running, between the first start and the last end), the re-schedules (from the
workers' logs) and the Redis commands per task (``INFO commandstats`` on the shared
server: broker, results and permits together). Then the ratio of the median
makespans, the issue's target: bounded <= 1.3x unbounded.

The bounded task uses the package's defaults unless ``--countdown``, ``--jitter``,
``--wait`` or ``--waiters`` say otherwise; ``--wait 0`` re-schedules every refused run
(no waiting in place at all), ``--wait 5 --waiters 8`` lets every refused run wait.

The figures depend on the machine: run it on an otherwise idle one (the load average
is printed at the end).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The checkout this file is in, ahead of an installed (or editable, other worktree's)
# copy of the package: in this process and in the workers it starts (_common.ROOT).
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis
from _common import (
    add_to_dump,
    command_calls,
    parse_args,
    peak,
    print_table,
    start_worker,
    stop_workers,
)

from celery_redislock.testing import RedisServer

APP = """
import time
import redis
from celery import Celery
from celery_redislock import bounded_task

app = Celery("bench_bounded", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False,
                worker_prefetch_multiplier={prefetch})
records = redis.Redis.from_url({locks!r})
OPTIONS = {options!r}


def _body(label, i, seconds):
    start = time.time()
    time.sleep(seconds)
    records.rpush(label, f"{{start}} {{time.time()}}")


@bounded_task(app=app, name="bench.bounded", concurrency_limit={limit}, **OPTIONS)
def bounded(label, i, seconds):
    _body(label, i, seconds)


@app.task(name="bench.plain")
def plain(label, i, seconds):
    _body(label, i, seconds)
"""


@contextmanager
def worker(
    directory: str, module: str, queue: str, concurrency: int, options: tuple[str, ...] = ()
) -> Iterator[int]:
    """A ``celery worker`` subprocess (prefork) on ``queue``, ready on entry; its pid.

    ``options``: more ``celery worker`` options, e.g. ``("--prefetch-multiplier", "1")``."""
    log_path = os.path.join(directory, f"{queue}-{uuid.uuid4().hex[:6]}.log")
    process = start_worker(
        directory, module, queue, log_path, "-Q", queue, *options, concurrency=concurrency
    )
    try:
        deadline = time.monotonic() + 30
        while " ready." not in Path(log_path).read_text(encoding="utf-8", errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start: see {log_path}")
            time.sleep(0.05)
        yield process.pid
    finally:
        stop_workers([process])


def run_batch(
    tasks: Any,
    task: Any,
    queue: str,
    records: redis.Redis,
    admin: redis.Redis,
    count: int,
    seconds: float,
) -> dict[str, Any]:
    """Send ``count`` calls of ``task`` to ``queue``; wait for every run to end."""
    label = f"runs-{uuid.uuid4().hex[:8]}"
    commands = command_calls(admin)
    start = time.time()
    for i in range(count):
        task.apply_async((label, i, seconds), queue=queue)
    deadline = time.monotonic() + 60 + count * seconds * 2
    while records.llen(label) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {records.llen(label)} of {count} runs ended")
        time.sleep(0.002)
    rows = [tuple(float(x) for x in row.split()) for row in records.lrange(label, 0, -1)]
    intervals = [(s, e) for s, e in rows]
    first, last = min(s for s, _ in intervals), max(e for _, e in intervals)
    return {
        "start": start,
        "intervals": intervals,
        "makespan": last - start,
        "peak": peak(intervals),
        "busy": sum(e - s for s, e in intervals) / (peak(intervals) * (last - first)),
        "commands": (command_calls(admin) - commands) / count,
    }


def run(
    count: int,
    seconds: float,
    limit: int,
    rounds: int,
    options: dict[str, Any],
    prefetch: int,
    dump: str | None,
) -> None:
    with RedisServer() as server, tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_bounded_{uuid.uuid4().hex[:8]}"
        source = APP.format(
            broker=f"{base}/1",
            backend=f"{base}/2",
            locks=f"{base}/3",
            limit=limit,
            options=options,
            prefetch=prefetch,
        )
        with open(os.path.join(directory, f"{module}.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(source))
        sys.path.insert(0, directory)
        tasks = __import__(module)
        records = redis.Redis.from_url(f"{base}/3")
        admin = redis.Redis.from_url(f"{base}/0")
        stack.enter_context(worker(directory, module, "bounded", 4))
        stack.enter_context(worker(directory, module, "bounded", 4))
        stack.enter_context(worker(directory, module, "plain", limit))
        rescheduled_before = 0
        # Warm-up: connections, scripts, the renewers of every pool child.
        run_batch(tasks, tasks.bounded, "bounded", records, admin, 24, 0.01)
        run_batch(tasks, tasks.plain, "plain", records, admin, 24, 0.01)
        results: dict[str, list[dict[str, Any]]] = {"bounded": [], "unbounded": []}
        for _ in range(rounds):
            for label, task, queue in (
                ("unbounded", tasks.plain, "plain"),
                ("bounded", tasks.bounded, "bounded"),
            ):
                rescheduled_before = _log_count(directory, "re-sent to run")
                result = run_batch(tasks, task, queue, records, admin, count, seconds)
                result["rescheduled"] = (
                    _log_count(directory, "re-sent to run") - rescheduled_before
                    if label == "bounded"
                    else 0
                )
                results[label].append(result)
        records.close()
        admin.close()

    ideal = count * seconds / limit
    rows = []
    for label in ("unbounded", "bounded"):
        for i, r in enumerate(results[label]):
            rows.append(
                [
                    f"{label} #{i + 1}",
                    f"{r['makespan']:.2f}",
                    f"{ideal:.2f}",
                    int(r["peak"]),
                    f"{r['busy']:.0%}",
                    int(r["rescheduled"]),
                    f"{r['commands']:.1f}",
                ]
            )
    print(
        f"{count} tasks of {seconds * 1000:g} ms, limit {limit}: bounded on 2 workers x 4 "
        f"(prefork), unbounded on 1 worker x {limit}; options {options or 'default'}, "
        f"prefetch multiplier {prefetch}\n"
    )
    print_table(
        ["run", "makespan s", "ideal s", "peak", "busy", "re-scheduled", "Redis cmds/task"], rows
    )
    if dump:
        add_to_dump(
            **{
                label: [{"start": r["start"], "intervals": r["intervals"]} for r in rs]
                for label, rs in results.items()
            }
        )
    ratio = statistics.median(r["makespan"] for r in results["bounded"]) / statistics.median(
        r["makespan"] for r in results["unbounded"]
    )
    print(f"\nbounded / unbounded, ratio of median makespans: {ratio:.3f} (target <= 1.3)")
    print(
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def _log_count(directory: str, text: str) -> int:
    total = 0
    for name in os.listdir(directory):
        if name.startswith("bounded-") and name.endswith(".log"):
            with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                total += f.read().count(text)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="the backlog case: parked vs re-publish (see _backlog.py)",
    )
    parser.add_argument("--tasks", type=int, help="tasks per run (200; backlog 60)")
    parser.add_argument(
        "--duration", type=float, help="seconds each task sleeps (0.05; backlog 0.2)"
    )
    parser.add_argument("--limit", type=int, help="concurrency_limit (3; backlog 2)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each (interleaved)")
    parser.add_argument("--countdown", type=float, help="concurrency_countdown (s)")
    parser.add_argument("--jitter", type=float, help="concurrency_jitter (s)")
    parser.add_argument("--wait", type=float, help="concurrency_wait (s)")
    parser.add_argument("--waiters", type=int, help="concurrency_waiters")
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier")
    parser.add_argument(
        "--modes",
        help="backlog: comma-separated subset of: unbounded, "
        "plain c2, plain c2 acks_late, parked, parked in child, "
        "parked+standby, re-publish (all)",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="backlog: stamp and print each hand-off's stages (_stages.py)",
    )
    args = parse_args(parser)
    if args.backlog:
        from _backlog import MODES, run_backlog

        modes = tuple(m.strip() for m in args.modes.split(",")) if args.modes else MODES
        if not set(modes) <= set(MODES):
            parser.error(f"--modes: choose among {', '.join(MODES)}, got {args.modes!r}")
        run_backlog(
            args.tasks or 60,
            args.duration or 0.2,
            args.limit or 2,
            args.rounds,
            modes,
            args.stages,
            args.dump,
        )
        return
    args.tasks, args.duration = args.tasks or 200, args.duration or 0.05
    args.limit = args.limit or 3
    options = {
        f"concurrency_{name}": value
        for name, value in (
            ("countdown", args.countdown),
            ("jitter", args.jitter),
            ("wait", args.wait),
            ("waiters", args.waiters),
        )
        if value is not None
    }
    run(args.tasks, args.duration, args.limit, args.rounds, options, args.prefetch, args.dump)


if __name__ == "__main__":
    main()
