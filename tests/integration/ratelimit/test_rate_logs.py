"""What a worker's log says about the runs of a rate-limited task (a new user's first
look, #29): every run is logged as it arrives, once -- Celery's ``received`` line, or
ours when it is published from the limiter's queue -- and our line names a rate
limiter, not a pool. A real ``celery worker`` (prefork, 2 processes).

Before: a run the limiter admitted at send (published at once with its admission
reserved) had no line at all before its ``succeeded``: its ``received`` line was
dropped as if it had been released from the queue, which logged nothing for it; and
the queue's line said "of pool 'api'" for a rate limiter.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..workers import AppModule, WorkerProcess

pytestmark = pytest.mark.slow

BODY = """
from celery_redislock import rate_limited_task

@rate_limited_task(app=app, global_rate_limit="3/s", global_rate_key="crm-api")
def call(n):
    return n
"""


def test_each_run_is_logged_once_as_it_arrives_and_the_limiter_is_named(
    tmp_path: Path, redis_url: str
) -> None:
    module = AppModule(tmp_path, redis_url, BODY)
    with WorkerProcess(module, concurrency=2) as worker:
        tasks = module.load()
        results = [tasks.call.delay(n) for n in range(6)]  # 3 admitted at send, 3 parked
        assert [r.get(timeout=20) for r in results] == list(range(6))
        log = worker.log()
    received = re.findall(r"\[([0-9a-f-]{36})\] received", log)
    released = re.findall(r"\[([0-9a-f-]{36})\] released from the parked queue", log)
    for result in results:
        lines = [line for line in log.splitlines() if result.id in line]
        assert received.count(result.id) + released.count(result.id) == 1, lines
    assert len(received) == 3 and len(released) == 3, log[-4000:]
    assert "of rate limiter 'crm-api'" in log and "pool 'crm-api'" not in log, log[-4000:]
