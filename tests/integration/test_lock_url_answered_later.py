"""A lock Redis that was down when the worker started, and answered later, is waited
for through its next outage in every pool process (#29 item 5: "keep waiting through
outages of a Redis that did answer before"), also in a process forked after it first
answered (``worker_max_tasks_per_child``, a replaced child). Before, only the process
that had seen the answer knew: a fresh child failed its run at once with
``ConfigurationError`` ("has not answered since this worker started"), and the task
was lost.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from celery_redislock.testing import RedisServer

from .workers import LOCKS_DB, AppModule, WorkerProcess, db_url

# Not serial (as test_lock_url_never_answered): one worker of one pool process, and
# the waits it asserts have no upper bound but the result's timeout -- the lock Redis
# is down for 3 s, the run must wait it out, however long that takes under load.
pytestmark = pytest.mark.slow

BODY = """
from celery_redislock import bounded_task


@bounded_task(app=app, concurrency_limit=2)
def call():
    return "ran"
"""

CONF = """{
    "redislock_client_options": {"socket_timeout": 1, "socket_connect_timeout": 1},
    "worker_prefetch_multiplier": 1,
    "worker_max_tasks_per_child": 1,
}"""


def test_a_fresh_child_waits_through_an_outage_of_a_redis_that_answered(
    tmp_path: Path, redis_url: str
) -> None:
    with RedisServer() as probe:
        port = probe.port
    locks = RedisServer(port=port)  # not started: down when the worker starts
    module = AppModule(tmp_path, redis_url, BODY, conf=CONF)
    module.path.write_text(module.path.read_text().replace(db_url(redis_url, LOCKS_DB), locks.url))
    try:
        with WorkerProcess(module, concurrency=1) as worker:
            worker.wait_for_log("does not answer", timeout=20)
            tasks = module.load()
            locks.start()
            assert tasks.call.delay().get(timeout=60) == "ran"  # it answered: in a child
            locks.stop()
            later = threading.Timer(3.0, locks.start)
            later.start()
            try:
                # Run by a new child (one task per child): the outage is waited for.
                result = tasks.call.apply_async(ignore_result=False)
                assert result.get(timeout=90) == "ran", worker.log()[-3000:]
            finally:
                later.join()
    finally:
        locks.stop()
