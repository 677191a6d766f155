"""Bounded concurrency: at most N runs of a pool at once, across every worker.

Shown in docs/guides/bounded.md and the README; run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

import os
import threading
import time

_guard = threading.Lock()
_inside = 0
most_at_once = 0


def call_payment_api(order_id: int) -> int:
    """Stands for the API call; records how many calls run at once."""
    global _inside, most_at_once
    with _guard:
        _inside += 1
        most_at_once = max(most_at_once, _inside)
    time.sleep(0.2)
    with _guard:
        _inside -= 1
    return order_id


# --8<-- [start:task]
from celery import Celery

from celery_redislock import bounded_task

app = Celery("proj", broker="redis://localhost:6379/0", backend="redis://localhost:6379/1")


@bounded_task(app=app, concurrency_limit=2, concurrency_key="payment-api")
def charge(order_id: int) -> int:
    return call_payment_api(order_id)  # at most 2 at once, across every worker


# --8<-- [end:task]

app.conf.task_default_queue = "docs-bounded"


def main() -> None:
    from celery.contrib.testing.worker import start_worker

    # the tests' private redis-server instead of the one on 6379
    app.conf.update(broker_url=os.environ["REDIS_URL"], result_backend=os.environ["REDIS_URL"])
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results = [charge.delay(i) for i in range(6)]
        assert sorted(r.get(timeout=30) for r in results) == list(range(6))
    assert most_at_once == 2, most_at_once  # the cap held, and was reached


if __name__ == "__main__":
    main()
