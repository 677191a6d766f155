"""Singleton tasks: the same job never runs twice at once and is not queued twice.

Shown in docs/guides/singleton.md and the README; run by tests/integration/test_docs_examples.py
against a private redis-server (``REDIS_URL``) with an in-process worker.
"""

from __future__ import annotations

import os

# --8<-- [start:task]
from celery import Celery

from celery_redislock import singleton_task

app = Celery("proj", broker="redis://localhost:6379/0", backend="redis://localhost:6379/1")
# app.conf.redislock_url = "redis://localhost:6379/2"  # default: the broker, when it is Redis


@singleton_task(app=app)
def refresh_user(user_id: int, full: bool = False) -> str:
    return f"refreshed {user_id}"  # never runs twice at once for the same user_id


# --8<-- [end:task]

app.conf.task_default_queue = "docs-singleton"


def main() -> None:
    from celery.contrib.testing.worker import start_worker

    # the tests' private redis-server instead of the one on 6379
    app.conf.update(broker_url=os.environ["REDIS_URL"], result_backend=os.environ["REDIS_URL"])
    # --8<-- [start:call]
    a = refresh_user.delay(42)
    b = refresh_user.delay(user_id=42, full=False)  # same job: b.id == a.id, nothing sent
    # --8<-- [end:call]
    assert b.id == a.id
    with start_worker(app, pool="threads", perform_ping_check=False):
        assert a.get(timeout=10) == "refreshed 42"
    assert refresh_user.delay(42).id != a.id  # done: the lock is free again


if __name__ == "__main__":
    main()
