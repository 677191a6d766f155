"""The lock Redis stopped for 15 s mid-backlog of a rate-limited task (#25): runs are delayed,
not failed, none lost or run twice, no worker exits, and the rate holds after it
returns. Real ``celery worker`` processes (prefork), a lock Redis of its own that the
test stops (keeping its data) and starts again; every run appends
``"<start> <task id> <retries>"`` to a file (Redis is down part of the time)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from celery_redislock.testing import RedisServer

from ..helpers import wait_until
from ..workers import LOCKS_DB, AppModule, WorkerProcess, db_url, side_by_side
from .test_rate_limited import WAY, _windows

pytestmark = [pytest.mark.slow, pytest.mark.serial]


BODY = """
from celery_redislock import rate_limited_task
RECORDS = {records!r}

@rate_limited_task(app=app, bind=True, global_rate_limit="4/s", global_rate_key="api")
def call(self):
    with open(RECORDS, "a") as out:
        out.write(f"{{time.time()}} {{self.request.id}} {{self.request.retries}}\\n")
"""
CONF = """{
    "task_ignore_result": True,
    "redislock_park_sweep_interval": 0.5,
    "redislock_client_options": {"socket_timeout": 1, "socket_connect_timeout": 1},
    "broker_connection_max_retries": None,
}"""


def _runs(records: Path) -> list[tuple[float, str, int]]:
    if not records.exists():
        return []
    rows = (line.split() for line in records.read_text().splitlines() if line.strip())
    return sorted((float(start), task_id, int(retries)) for start, task_id, retries in rows)


def _module(tmp_path: Path, redis_url: str, records: Path, lock_url: str) -> AppModule:
    """The worker module of these tests: the task of BODY writing to ``records``, its
    lock Redis at ``lock_url`` (a server of the test's own, which it stops)."""
    module = AppModule(tmp_path, redis_url, BODY.format(records=str(records)), conf=CONF)
    source = module.path.read_text().replace(db_url(redis_url, LOCKS_DB), lock_url)
    module.path.write_text(source)
    return module


def test_the_lock_redis_stopped_mid_backlog_delays_runs_and_loses_none(
    tmp_path: Path, redis_url: str
) -> None:
    records = tmp_path / "runs.txt"
    with RedisServer() as lock_server:
        module = _module(tmp_path, redis_url, records, lock_server.url)
        workers = [WorkerProcess(module, concurrency=2, name=n) for n in ("a", "b")]
        with side_by_side(*workers):
            tasks = module.load()
            sent = [tasks.call.delay().id for _ in range(16)]  # 4 s of runs at 4/s
            wait_until(lambda: len(_runs(records)) >= 5, timeout=20, what="a few runs")
            with contextlib.suppress(redis.ConnectionError):
                redis.Redis.from_url(lock_server.url).shutdown(save=True)
            assert lock_server.process is not None
            lock_server.process.wait(10)
            lock_server.process = None
            stopped = time.time()
            sent += [tasks.call.delay().id for _ in range(4)]  # sent while it is down
            time.sleep(15)  # the 15 s (#25)
            started_again = time.time()
            lock_server.start()
            wait_until(lambda: len(_runs(records)) >= len(sent), timeout=90, what="every run")
            time.sleep(1)  # nothing runs twice late
            runs = _runs(records)
            counts = Counter(task_id for _, task_id, _ in runs)
            twice = {
                sent.index(t): [at - stopped for at, u, _ in runs if u == t]
                for t in counts
                if counts[t] > 1
            }
            assert sorted(counts) == sorted(sent) and not twice, (twice, started_again - stopped)
            assert all(retries == 0 for _, _, retries in runs)
            assert not [at for at, _, _ in runs if stopped + 0.5 < at < started_again]
            assert _windows([at for at, _, _ in runs], 1.0 - WAY) <= 4, "the rate holds"
            for worker in workers:
                assert worker.process is not None and worker.process.poll() is None, worker.log()[
                    -3000:
                ]


def test_a_limiter_whose_state_was_lost_lets_no_fresh_burst_through(
    tmp_path: Path, redis_url: str
) -> None:
    """The lock Redis restarted empty mid-backlog (its limiter and parked runs gone):
    the limiter starts as spent for one period in the Celery path too, so the runs
    that come back (from the journal, or sent after) never exceed the rate."""
    records = tmp_path / "runs.txt"
    with RedisServer() as lock_server:
        module = _module(tmp_path, redis_url, records, lock_server.url)
        workers = [WorkerProcess(module, concurrency=2, name=n) for n in ("a", "b")]
        with side_by_side(*workers):
            tasks = module.load()
            sent = [tasks.call.delay().id for _ in range(12)]  # 3 s of runs at 4/s
            wait_until(lambda: len(_runs(records)) >= 6, timeout=20, what="a few runs")
            lock_server.restart()  # SIGKILL, then an empty server on the same port
            restarted = time.time()
            sent += [tasks.call.delay().id for _ in range(8)]  # a fresh burst after the loss
            wait_until(
                lambda: len({t for _, t, _ in _runs(records)} & set(sent[12:])) == 8,
                timeout=60,
                what="the runs sent after the loss",
            )
            time.sleep(1.5)
            runs = _runs(records)
            counts = Counter(task_id for _, task_id, _ in runs)
            assert max(counts.values()) == 1, "no run twice"
            assert all(retries == 0 for _, _, retries in runs)
            starts = [at for at, _, _ in runs]
            assert _windows(starts, 1.0 - WAY) <= 4, (restarted, starts)
            for worker in workers:
                assert worker.process is not None and worker.process.poll() is None, worker.log()[
                    -3000:
                ]
