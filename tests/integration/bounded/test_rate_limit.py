"""Celery's own ``rate_limit`` beside a bounded pool (#29 item 1), scaled down: a burst of
a bounded task with ``rate_limit`` runs at the rate asked, with no stall.

Before, each message waited for a token of Celery's bucket in the worker's main
process before intake parking looked at it: the backlog left the broker at the rate
limit, a parked message spending a token as a run does, and the runs a release
published went to the tail of that backlog -- the pool idled while it trickled
through (the issue's 200 calls: ~90 s). The full measurement, beside plain Celery, is
``benchmarks/bench_backlog_ratelimit.py``.

Two real ``celery worker`` subprocesses (prefork, 4 processes each), as the issue's.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import redis

from ..helpers import wait_until
from ..workers import AppModule, WorkerProcess, side_by_side
from .helpers import RECORD, peak, runs

pytestmark = pytest.mark.slow

CALLS = 60
RATE = 10.0  # per second, per worker: 2 workers run CALLS / (2 * RATE) = 3 s at the rate

BODY = (
    RECORD
    + f"""
from celery_redislock import bounded_task


@bounded_task(app=app, concurrency_limit=3, concurrency_key="partner-api",
              rate_limit="{RATE:g}/s")
def call(n):
    record("runs", str(n), 0.1)
"""
)


def test_a_bounded_burst_with_celerys_rate_limit_runs_at_the_rate_without_a_stall(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    module = AppModule(tmp_path, redis_url, BODY)
    tasks = module.load()
    a, b = WorkerProcess(module, concurrency=4), WorkerProcess(module, concurrency=4)
    with side_by_side(a, b):
        for n in range(CALLS):
            tasks.call.delay(n)
        wait_until(lambda: len(runs(locks, "runs")) >= CALLS, timeout=120, what="every call run")
        log = a.log() + b.log()
    done = runs(locks, "runs")
    assert sorted(int(label) for _, _, label in done) == list(range(CALLS))  # each once
    assert peak(done) <= 3
    starts = [start for start, _, _ in done]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # At the rate asked, a start every 1 / (2 * RATE) s; before, released runs waited
    # behind the backlog (gaps of several seconds) and the burst took twice as long
    # (every parked message spent a token too). Generous bounds for a loaded machine.
    assert max(gaps) < 3.0, f"a stall of {max(gaps):.1f}s"
    assert starts[-1] - starts[0] < CALLS / (2 * RATE) * 3
    assert "is a second message" not in log
