"""A ``redislock_url`` that never answered is a configuration error (#29 item 5), on a
real ``celery worker`` (prefork) whose lock Redis URL points at a port nobody serves.

Before: each bounded run held its worker process for ~2 minutes (60 attempts), then
failed with "raise redislock_outage_attempts to wait longer" -- advice pointing the
wrong way. Now the run fails at once with ``ConfigurationError`` naming
``redislock_url`` and its masked value, and the worker says so when it starts. On the
client, ``delay()`` says the error is the lock Redis's, not the broker's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_redislock import singleton_task
from celery_redislock.testing import RedisServer

from .workers import LOCKS_DB, AppModule, WorkerProcess, db_url

pytestmark = pytest.mark.slow

BODY = """
from celery_redislock import bounded_task, rate_limited_task


@bounded_task(app=app, concurrency_limit=2)
def call():
    return "ran"


@rate_limited_task(app=app, global_rate_limit="5/s")
def limited():
    return "ran"
"""

CONF = """{
    "redislock_client_options": {"socket_timeout": 1, "socket_connect_timeout": 1},
    "worker_prefetch_multiplier": 1,
}"""


def _dead_url() -> str:
    """A URL (with a password, to see it masked) on a port where nothing listens."""
    with RedisServer() as server:
        port = server.port
    return f"redis://:hunter2@127.0.0.1:{port}/0"


def test_a_run_fails_fast_when_the_lock_url_never_answered(tmp_path: Path, redis_url: str) -> None:
    dead = _dead_url()
    module = AppModule(tmp_path, redis_url, BODY, conf=CONF)
    module.path.write_text(module.path.read_text().replace(db_url(redis_url, LOCKS_DB), dead))
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        started = time.monotonic()
        result = tasks.call.delay()
        with pytest.raises(Exception, match="redislock_url") as failed:
            result.get(timeout=60)
        took = time.monotonic() - started
        message = str(failed.value)
        assert type(failed.value).__name__ == "ConfigurationError", message
        assert "127.0.0.1" in message and "hunter2" not in message, message
        assert "has not answered since this worker started" in message, message
        assert "raise redislock_outage_attempts" not in message, message
        assert took < 20, f"failed after {took:.1f}s"
        log = worker.log()
        assert "does not answer" in log and "redislock_url=" in log, log[-3000:]
        assert "hunter2" not in log, log[-3000:]
        # One of the worker's log lines (its format, its timestamp), not a bare line
        # printed before the worker set its logging up; it names every kind of task
        # that fails (a rate-limited run fails at once too).
        assert re.search(
            r"ERROR/MainProcess\] celery_redislock: the lock Redis, .*does not answer", log
        ), log[-3000:]
        assert "global rate limits fail at once" in log, log[-3000:]
        # Said once: not again by the sweeper and the rate pump as if parked runs met an
        # outage (a new user, #29: three lines at the start for one wrong URL).
        assert "cannot be swept" not in log and "cannot be pumped" not in log, log[-3000:]


def test_the_worker_says_at_start_that_the_lock_redis_answers(
    tmp_path: Path, redis_url: str
) -> None:
    """A new user's worker said nothing of the lock Redis when it answered: the INFO
    line was logged on ``worker_init``, before the worker's logging was set up."""
    module = AppModule(tmp_path, redis_url, BODY)
    with WorkerProcess(module, concurrency=1) as worker:
        worker.wait_for_log("answers", timeout=10)
        log = worker.log()
    locks = db_url(redis_url, LOCKS_DB)
    assert (
        f"INFO/MainProcess] celery_redislock: the lock Redis, redislock_url={locks!r}, answers"
        in log
    ), log[-3000:]


def test_delay_names_the_lock_redis_not_the_broker(redis_url: str) -> None:
    app = Celery("dead-locks", broker=db_url(redis_url, 1), set_as_current=False)
    app.conf.redislock_url = _dead_url()
    app.conf.redislock_client_options = {"socket_timeout": 1, "socket_connect_timeout": 1}

    @singleton_task(app=app, shared=False)
    def job() -> None: ...

    with pytest.raises(redis.ConnectionError) as failed:
        job.delay()
    message = str(failed.value)
    assert "the lock Redis, redislock_url='redis://:**@127.0.0.1:" in message, message
    assert "hunter2" not in message
    app.close()
