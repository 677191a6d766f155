"""Counts exact under prefork (#27), short: 2 workers x 2 processes, 120 singleton and
bounded tasks with duplicates and 4 pool processes SIGKILLed in a body, then 30
rate-limited tasks at 15/s; every counter equals what the scenario recorded itself
(see scenario.py; the full run, 4 x 4 and 2,000 tasks, is
benchmarks/bench_metrics_exact.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from celery_redislock.celery.metrics.read import read_counters

from . import scenario

pytestmark = pytest.mark.serial  # many processes


def test_counts_exact_under_prefork_with_kills(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    outcome = scenario.run(
        tmp_path, redis_url, workers=2, processes=2, tasks=120, kills=2, timeout=90
    )
    view = {k: outcome.counted.get(k, 0) for k in outcome.expected}
    assert view == outcome.expected
    assert outcome.killed == 4
    refused = [v for k, v in outcome.expected.items() if k[2] == "refused_duplicate"]
    assert refused[0] > 0  # duplicates were sent
    reclaimed = [v for k, v in outcome.expected.items() if k[2] == "reclaimed"]
    assert reclaimed == [2, 2]
    # Runs were parked for the rate and handed their admission (30 sent at once at
    # 15/s: at least 15 parked).
    assert outcome.expected["ratelimit", "api-x", "handed_off"] >= 15
    # Every parked run started once, on a permit a release handed it; a run whose
    # permit its worker's intake reserved is granted, not handed off.
    [pool] = [c for c in read_counters(locks, "redislock") if c.kind == "semaphore"]
    assert pool.counts.get("handed_off", 0) == outcome.expected["parking", "pool-x", "parked"]
