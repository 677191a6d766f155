"""Celery's own ``rate_limit`` beside a bounded pool (#29 item 1), beside plain Celery.

Run from the repository root::

    python benchmarks/bench_backlog_ratelimit.py                  # 200 calls, 2 rounds
    python benchmarks/bench_backlog_ratelimit.py --calls 60 --rounds 1

``--calls`` tasks of ``--duration`` seconds are sent at once to 2 ``celery worker``
subprocesses x 4 prefork processes (a private ``redis-server`` holds broker, results
and locks), as the issue's new user did:

* **bounded**: ``@bounded_task(concurrency_limit=3, concurrency_key="partner-api",
  rate_limit="10/s")`` -- Celery's per-worker rate limit beside our pool;
* **plain**: ``@app.task(rate_limit="10/s")``, the same body: the control.

Each kind runs on its own workers and queue, one after the other in each round. Per
run: the time from the first send to the last end, the longest stall (the largest gap
between one run's start and the next, and from the first send to the first start),
the runs (each task must run once), the peak concurrency (interval sweep: <= the limit
for bounded), and the worker log's "is a second message" warnings (none may appear:
no message is delivered twice here) and re-publishes of parked runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import itertools

from _common import parse_args, peak, print_table, start_worker, stop_workers

from celery_redislock.testing import RedisServer

APP = """
import time
from celery import Celery
from celery_redislock import bounded_task

app = Celery("bench_rl", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False)


def _body(kind, seconds):
    start = time.time()
    time.sleep(seconds)
    with open({records!r} + "." + kind, "a") as out:
        out.write(f"{{start}} {{time.time()}}\\n")


@bounded_task(app=app, name="rl.bounded", concurrency_limit={limit},
              concurrency_key="partner-api", rate_limit={rate!r})
def bounded(seconds):
    _body("bounded", seconds)


@app.task(name="rl.plain", rate_limit={rate!r})
def plain(seconds):
    _body("plain", seconds)
"""


def _runs(path: Path) -> list[tuple[float, float]]:
    if not path.exists():
        return []
    rows = (line.split() for line in path.read_text().splitlines() if line.strip())
    return sorted((float(s), float(e)) for s, e in rows)


def run_kind(
    kind: str, directory: str, module: str, tasks: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Send ``args.calls`` tasks of ``kind`` to 2 fresh workers; what happened."""
    queue = f"q-{kind}"
    logs = [Path(directory, f"worker-{queue}-{n}.log") for n in range(2)]
    workers = [
        start_worker(directory, module, f"w{n}", str(log), "-Q", queue)
        for n, log in enumerate(logs)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(" ready." in p.read_text(errors="replace") for p in logs if p.exists()):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.1)
        task = getattr(tasks, kind)
        path = Path(f"{directory}/runs.{kind}")
        t0 = time.time()
        for _ in range(args.calls):
            task.apply_async((args.duration,), queue=queue)
        deadline = time.monotonic() + args.timeout
        while len(_runs(path)) < args.calls and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a second run of one task would show up now
        runs = _runs(path)
        starts = [t0] + [s for s, _ in runs]
        text = "".join(p.read_text(errors="replace") for p in logs)
        return {
            "ran": len(runs),
            "total": (max(e for _, e in runs) - t0) if runs else float("nan"),
            "stall": max((b - a for a, b in itertools.pairwise(starts)), default=0.0),
            "peak": peak(runs),
            "second": text.count("is a second message"),
            "released": text.count("released from the parked queue"),
        }
    finally:
        stop_workers(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--duration", type=float, default=0.1, help="seconds each call sleeps")
    parser.add_argument("--limit", type=int, default=3, help="concurrency_limit")
    parser.add_argument("--rate", default="10/s", help="Celery's rate_limit of both kinds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait per run")
    parser.add_argument("--kinds", default="plain,bounded")
    args = parse_args(parser)
    rows = []
    totals: dict[str, list[float]] = {}
    for n in range(args.rounds):
        with RedisServer() as server, tempfile.TemporaryDirectory() as directory:
            base = server.url.rsplit("/", 1)[0]
            module = f"bench_rl_{uuid.uuid4().hex[:8]}"
            Path(directory, f"{module}.py").write_text(
                textwrap.dedent(
                    APP.format(
                        broker=f"{base}/1",
                        backend=f"{base}/2",
                        locks=f"{base}/3",
                        records=f"{directory}/runs",
                        limit=args.limit,
                        rate=args.rate,
                    )
                ),
                encoding="utf-8",
            )
            sys.path.insert(0, directory)
            tasks = __import__(module)
            for kind in args.kinds.split(","):
                r = run_kind(kind, directory, module, tasks, args)
                totals.setdefault(kind, []).append(r["total"])
                rows.append(
                    [
                        f"#{n + 1} {kind}",
                        f"{r['ran']}/{args.calls}",
                        f"{r['total']:.1f}",
                        f"{r['stall']:.2f}",
                        r["peak"],
                        r["second"],
                        r["released"],
                    ]
                )
                print(f"round {n + 1} {kind}: {r['total']:.1f}s", flush=True)
    print(
        f"\n{args.calls} calls of {args.duration * 1000:g} ms, rate_limit={args.rate!r} "
        f"(Celery's, per worker), 2 workers x 4 (prefork); bounded: concurrency_limit="
        f"{args.limit}\n"
    )
    print_table(
        [
            "round",
            "ran",
            "total s",
            "longest stall s",
            "peak",
            "'second message' warnings",
            "released from parking",
        ],
        rows,
    )
    if "plain" in totals and "bounded" in totals:
        ratio = sum(totals["bounded"]) / sum(totals["plain"])
        print(f"\nbounded / plain (total time, all rounds): {ratio:.2f}")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
