"""The Celery backlog of a global rate limit (issue #25), beside what users run today.

``--tasks`` tasks (200) of ``--duration`` seconds (0.02) sent at once to 2 workers x 4
processes (prefork), at ``--rate`` ("20/s"), three ways, one after the other on the
same workers and Redis:

* **ours**: ``@rate_limited_task(global_rate_limit=rate)`` -- over the rate a run is
  parked in Redis and started at its admission time; halfway through the batch a
  plain task is sent to the same workers (how long until it starts);
* **celery rate_limit**: Celery's own ``rate_limit=rate``, which is per worker
  instance (2 workers: up to twice the rate) and holds the messages in the workers;
* **retry-based**: the body asks a ``RedisRateLimiter`` without waiting and calls
  ``self.retry(countdown=retry_after)`` when refused (what users write with Redis
  limiters today: every refusal a re-publish and a retry burned).

Per way: runs (each exactly once?), runs with ``retries > 0`` and the retries burned,
the most starts in any window of one period (interval sweep over the recorded starts;
the rate's N is the bound), the drain (first send to last end) over the ideal
(``tasks / N`` periods), publishes per task (the broker's LPUSH calls), the workers'
CPU ms per task, the p50/p99 start lateness against the admission schedule (run k,
in start order, is due ``(k // N)`` periods after the first start) and how much of it
is drift (how much later each period's first start comes than a period after the
last one's: a slope in ms per period), and for ours the
plain task's wait. The load average is printed with the table.

    python benchmarks/bench_rate_backlog.py                 # 200 x 20 ms at 20/s
    python benchmarks/bench_rate_backlog.py --tasks 60 --rate 10/s --ways ours
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis
from _backlog import _cpu, _pushes
from _common import parse_args, percentile
from bench_bounded import worker

from celery_redislock.core.ratelimit_rates import parse_rates
from celery_redislock.testing import RedisServer

APP = """
import time
import redis
from celery import Celery
from celery_redislock import RedisRateLimiter, rate_limited_task

app = Celery("bench_rate", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False)
records = redis.Redis.from_url({locks!r})


def _body(label, request, seconds):
    start = time.time()
    time.sleep(seconds)
    records.rpush(label, f"{{start}} {{time.time()}} {{request.retries}} {{request.id}}")


@rate_limited_task(app=app, name="bench.ours", global_rate_limit={rate!r}, bind=True)
def ours(self, label, seconds):
    _body(label, self.request, seconds)


@app.task(name="bench.celery", rate_limit={celery_rate!r}, bind=True)
def celery_limited(self, label, seconds):
    _body(label, self.request, seconds)


@app.task(name="bench.retry", bind=True, max_retries=None)
def retried(self, label, seconds):
    limiter = RedisRateLimiter(records, "bench-retry", rate={rate!r})
    if not limiter.acquire(blocking=False):
        raise self.retry(countdown=max(0.001, limiter.retry_after()))
    _body(label, self.request, seconds)


@app.task(name="bench.plain")
def plain(label):
    records.rpush(label, str(time.time()))
"""

WAYS = ("ours", "celery rate_limit", "retry-based")
_TASKS = {"ours": "ours", "celery rate_limit": "celery_limited", "retry-based": "retried"}


def most_in_window(starts: list[float], period: float) -> int:
    """The most starts in any half-open window of ``period`` (interval sweep)."""
    starts, most, low = sorted(starts), 0, 0
    for high, at in enumerate(starts):
        while at - starts[low] >= period:
            low += 1
        most = max(most, high - low + 1)
    return most


def _drift(starts: list[float], limit: int, period: float) -> float:
    """Seconds per period the first start of each period's ``limit`` starts comes
    later than a period after the one before (a least-squares slope, over the whole
    periods after the first)."""
    firsts = [starts[k] - k // limit * period for k in range(0, len(starts), limit)]
    if len(firsts) < 2:
        return 0.0
    xs = range(len(firsts))
    mean_x, mean_y = sum(xs) / len(firsts), sum(firsts) / len(firsts)
    top = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, firsts, strict=True))
    return top / sum((x - mean_x) ** 2 for x in xs)


def batch(
    tasks: Any,
    way: str,
    records: redis.Redis,
    pids: list[int],
    n: int,
    seconds: float,
    limit: int,
    period: float,
) -> dict[str, Any]:
    label, plain_label = f"runs-{uuid.uuid4().hex[:8]}", f"plain-{uuid.uuid4().hex[:8]}"
    task = getattr(tasks, _TASKS[way])
    pushes, cpu = _pushes(records), _cpu(pids)
    first = time.time()
    for _ in range(n):
        task.delay(label, seconds)
    plain_wait = None
    deadline = time.monotonic() + 120 + 4 * n * period / limit
    plain_sent = None
    while records.llen(label) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{way}: only {records.llen(label)} of {n} runs ended")
        if plain_sent is None and records.llen(label) >= n // 2 and way == "ours":
            plain_sent = time.time()
            tasks.plain.delay(plain_label)
        time.sleep(0.005)
    time.sleep(0.5)
    rows = [r.split() for r in records.lrange(label, 0, -1)]
    starts = sorted(float(r[0]) for r in rows)
    ends = [float(r[1]) for r in rows]
    retries = [int(r[2]) for r in rows]
    if plain_sent is not None:
        got = records.lrange(plain_label, 0, -1)
        plain_wait = float(got[0]) - plain_sent if got else None
    due = [starts[0] + (k // limit) * period for k in range(len(starts))]
    late = [start - at for start, at in zip(starts, due, strict=True)]
    ideal = n / limit * period
    return {
        "runs": len(rows),
        "distinct": len({r[3] for r in rows}),
        "retried runs": sum(1 for r in retries if r),
        "retries": sum(retries),
        "max/window": most_in_window(starts, period),
        "drain": max(ends) - first,
        "ideal": ideal,
        "publishes": (_pushes(records) - pushes) / n,
        "cpu ms": (_cpu(pids) - cpu) / n * 1000,
        "late p50": percentile(late, 50) * 1000,
        "late p99": percentile(late, 99) * 1000,
        "drift": _drift(starts, limit, period) * 1000,
        "plain wait": plain_wait,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--duration", type=float, default=0.02)
    parser.add_argument("--rate", default="20/s")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"subset of: {', '.join(WAYS)}")
    args = parse_args(parser)
    ways = [w.strip() for w in args.ways.split(",")]
    (rate,) = parse_rates(args.rate, "--rate")
    with RedisServer() as server, tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_rate_{uuid.uuid4().hex[:8]}"
        source = APP.format(
            broker=f"{base}/1",
            backend=f"{base}/2",
            locks=f"{base}/3",
            rate=args.rate,
            celery_rate=f"{rate.limit / rate.period:g}/s",
        )
        Path(directory, f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        sys.path.insert(0, directory)
        tasks = __import__(module)
        records = redis.Redis.from_url(f"{base}/3")
        pids = [stack.enter_context(worker(directory, module, "celery", 4)) for _ in range(2)]
        tasks.plain.delay("warm-up")
        results = {
            way: batch(
                tasks, way, records, pids, args.tasks, args.duration, rate.limit, rate.period
            )
            for way in ways
        }
    print(
        f"\n{args.tasks} tasks of {args.duration * 1000:.0f} ms at {args.rate!r}, sent at once to "
        f"2 workers x 4 processes; ideal drain {args.tasks / rate.limit * rate.period:.2f} s\n"
    )
    head = (
        "way",
        "runs",
        "retried",
        "retries",
        f"max/{rate.period:g}s",
        "drain s",
        "/ideal",
        "publishes/task",
        "CPU ms/task",
        "late p50 ms",
        "late p99 ms",
        "drift ms/period",
        "plain task wait s",
    )
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for way, r in results.items():
        cells = (
            way,
            f"{r['runs']} ({r['distinct']} ids)",
            r["retried runs"],
            r["retries"],
            f"{r['max/window']} (N={rate.limit})",
            f"{r['drain']:.2f}",
            f"{r['drain'] / r['ideal']:.3f}",
            f"{r['publishes']:.2f}",
            f"{r['cpu ms']:.1f}",
            f"{r['late p50']:.0f}",
            f"{r['late p99']:.0f}",
            f"{r['drift']:.0f}",
            "-" if r["plain wait"] is None else f"{r['plain wait']:.3f}",
        )
        print(" | ".join(str(c) for c in cells))
    print(f"\nload average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
