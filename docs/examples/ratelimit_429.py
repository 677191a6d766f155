"""Global rate limits for Celery tasks: several rates, a 429 holding every worker back,
one limiter per tenant combined with a concurrency limit.

Shown in docs/guides/rate-limits.md; run by tests/integration/test_docs_examples.py
against a private redis-server with an in-process worker.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from celery import Celery

app = Celery("proj", broker="redis://localhost:6379/0", backend="redis://localhost:6379/1")
app.conf.task_default_queue = "docs-ratelimit-429"
_guard = threading.Lock()
calls: list[float] = []


@dataclass
class Response:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)


def call_the_api(doc_id: int) -> Response:
    """Stands for the API: answers 429 (Retry-After: 1) to its first call."""
    with _guard:
        calls.append(time.monotonic())
        first = len(calls) == 1
    return Response(429, {"Retry-After": "1"}) if first else Response(200)


# --8<-- [start:tasks]
from celery_redislock import RateLimited, rate_limited_task


@rate_limited_task(app=app, global_rate_limit=["10/s", "500/m"], global_rate_key="openai")
def summarize(doc_id):
    response = call_the_api(doc_id)
    if response.status_code == 429:  # every worker waits, this run is parked again
        raise RateLimited(retry_after=float(response.headers.get("Retry-After", 1)))


@rate_limited_task(
    app=app,
    global_rate_limit="5/s",
    global_rate_key=lambda tenant, *a, **kw: f"crm:{tenant}",  # one limiter per tenant
    concurrency_limit=3,  # and at most 3 at once
)
def sync_contacts(tenant): ...


# --8<-- [end:tasks]


def main() -> None:
    from celery.contrib.testing.worker import start_worker

    # the tests' private redis-server instead of the one on 6379
    app.conf.update(broker_url=os.environ["REDIS_URL"], result_backend=os.environ["REDIS_URL"])
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        summarize.delay(1).get(timeout=30)
        assert len(calls) == 2 and calls[1] - calls[0] >= 0.9  # held back by the 429
        assert [sync_contacts.delay(t).get(timeout=30) for t in ("acme", "initech")] == [
            None,
            None,
        ]


if __name__ == "__main__":
    main()
