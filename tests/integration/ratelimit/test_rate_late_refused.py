"""A run admitted by its rate whose body starts late moves its charge to its start
(``RateHold.on_start``, #25) -- a correction of a charge already made. When the lock
Redis refuses that one call with an error of its own (out of memory, read-only in a
failover), the run goes on, as it does when Redis does not answer: it was admitted and
charged once. Before, the error came out of the task's ``__call__`` before its body:
an admitted run failed without running."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import RedisLockTask
from celery_redislock.testing import RedisServer


@pytest.fixture
def lock_server() -> Iterator[redis.Redis]:
    """A lock Redis of this test's own: it is made to refuse writes."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()


def test_a_late_start_whose_charge_move_is_refused_still_runs(
    app: Celery, lock_server: redis.Redis, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kwargs = lock_server.connection_pool.connection_kwargs
    app.conf.redislock_url = f"redis://{kwargs['host']}:{kwargs['port']}/0"
    ran: list[int] = []

    class LateStart(RedisLockTask):  # type: ignore[type-arg]
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            super().before_start(task_id, args, kwargs)  # admitted: charged once
            time.sleep(0.05)  # the body starts past the take's 10 ms margin
            lock_server.config_set("maxmemory", 1)  # now every write is refused: OOM

    @app.task(base=LateStart, global_rate_limit="5/s", global_rate_key="late", shared=False)
    def call(n: int) -> int:
        lock_server.config_set("maxmemory", 0)
        ran.append(n)
        return n

    worker(app, concurrency=1)
    with caplog.at_level(logging.WARNING, logger="celery_redislock"):
        assert call.delay(1).get(timeout=10) == 1
    assert ran == [1]
    assert any("could not be charged again" in r.getMessage() for r in caplog.records)
