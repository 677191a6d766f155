"""Global rate limits for Celery tasks: every worker together starts at most N runs a period.

Shown in docs/guides/rate-limits.md and the README; run by tests/integration/test_docs_examples.py
against a private redis-server with an in-process worker.
"""

from __future__ import annotations

import os
import threading
import time

_guard = threading.Lock()
starts: list[float] = []


def call_partner_api(n: int) -> int:
    """Stands for the API call; records when each run started."""
    with _guard:
        starts.append(time.monotonic())
    return n


# --8<-- [start:task]
from celery import Celery

from celery_redislock import rate_limited_task

app = Celery("proj", broker="redis://localhost:6379/0", backend="redis://localhost:6379/1")


@rate_limited_task(app=app, global_rate_limit="5/s", global_rate_key="crm-api")
def sync_order(n: int) -> int:
    return call_partner_api(n)  # at most 5 starts in any second, across every worker


# --8<-- [end:task]

app.conf.task_default_queue = "docs-ratelimit-task"


def main() -> None:
    from celery.contrib.testing.worker import start_worker

    # the tests' private redis-server instead of the one on 6379
    app.conf.update(broker_url=os.environ["REDIS_URL"], result_backend=os.environ["REDIS_URL"])
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results = [sync_order.delay(n) for n in range(10)]  # over the rate: parked in Redis
        assert sorted(r.get(timeout=30) for r in results) == list(range(10))
    starts.sort()
    assert all(
        later - earlier >= 0.9 for earlier, later in zip(starts, starts[5:], strict=False)
    ), starts


if __name__ == "__main__":
    main()
