"""The limit holds when the lock Redis restarts empty while bounded runs are *running*
(core/restart.py), on real ``celery worker`` processes (prefork) and a lock Redis of
its own that the test SIGKILLs and starts again empty (no AOF, no RDB).

The runs last longer than the grace (the lease TTL), so the limit holds past it only
because their renewals put their permits back. Every run appends ``"<start> <end>
<task id>"`` to a file; an interval sweep over them must never exceed the limit, each
task sent must run exactly once, and no worker may exit.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.testing import RedisServer

from ..helpers import wait_until
from ..workers import LOCKS_DB, AppModule, WorkerProcess, db_url, side_by_side
from .helpers import peak

pytestmark = pytest.mark.slow

LIMIT = 2
TTL = 2.0  # the lease TTL, and so the grace: runs of 5 s outlast it
RUN = 5.0

BODY = """
from celery_redislock import bounded_task

RECORDS = {records!r}


@bounded_task(app=app, bind=True, concurrency_limit={limit}, concurrency_key="api",
              lock_ttl={ttl})
def call(self, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(RECORDS, "a") as out:
        out.write(f"{{start}} {{time.time()}} {{self.request.id}}\\n")
"""

CONF = """{{
    "task_ignore_result": True,
    "redislock_prefix": {prefix!r},
    "redislock_restart_grace": {grace!r},
    "redislock_park_sweep_interval": 0.5,
    "redislock_client_options": {{"socket_timeout": 2, "socket_connect_timeout": 1}},
    "broker_connection_max_retries": None,
    "worker_prefetch_multiplier": 1,
}}"""


def _runs(records: Path) -> list[tuple[float, float, str]]:
    if not records.exists():
        return []
    rows = (line.split() for line in records.read_text().splitlines() if line.strip())
    return sorted((float(start), float(end), task_id) for start, end, task_id in rows)


def _running(sem: ParkingSemaphore) -> int:
    return sum(not h.token_hint.startswith("~restart") for h in sem.info().holders)


def restart_while_running(
    tmp_path: Path, redis_url: str, grace: bool
) -> tuple[list[tuple[float, float, str]], list[str], str, int]:
    """Runs of 5 s at limit 2; the lock Redis SIGKILLed while two run, back empty
    0.5 s later; more sent then. ``(runs, ids sent, worker logs, worker exits)``."""
    with RedisServer() as lock_server:
        records = tmp_path / "runs.txt"
        prefix = f"g{tmp_path.name[-8:]}"
        conf = CONF.format(prefix=prefix, grace=grace)
        body = BODY.format(records=str(records), limit=LIMIT, ttl=TTL)
        module = AppModule(tmp_path, redis_url, body, conf=conf)
        source = module.path.read_text().replace(db_url(redis_url, LOCKS_DB), lock_server.url)
        module.path.write_text(source)
        workers = [WorkerProcess(module, concurrency=2, name=n) for n in ("a", "b")]
        with side_by_side(*workers):
            tasks = module.load()
            locks = redis.Redis.from_url(lock_server.url)
            sem = ParkingSemaphore(locks, "api", limit=LIMIT, prefix=prefix)
            sent = [tasks.call.delay(RUN).id for _ in range(3)]
            wait_until(
                lambda: _running(sem) == LIMIT and sem.parking_info().parked >= 1,
                timeout=30,
                what="two runs running, one parked",
            )
            time.sleep(1.0)  # well into their runs, renewed at least once
            lock_server.kill()
            time.sleep(0.5)
            lock_server.start()  # empty
            sent += [tasks.call.delay(0.5).id for _ in range(4)]
            wait_until(lambda: len(_runs(records)) >= len(sent), timeout=90, what="every run sent")
            time.sleep(1)  # nothing runs twice late
            logs = workers[0].log() + workers[1].log()
            exits = sum(w.process is None or w.process.poll() is not None for w in workers)
            return _runs(records), sent, logs, exits


def test_runs_running_when_the_lock_redis_restarts_empty_keep_the_limit(
    tmp_path: Path, redis_url: str
) -> None:
    done, sent, logs, exits = restart_while_running(tmp_path, redis_url, True)
    counts = Counter(task_id for _, _, task_id in done)
    assert sorted(counts) == sorted(sent), "every task sent ran"
    assert max(counts.values()) == 1, "none ran twice"
    assert peak(done) <= LIMIT, done
    assert "put back by their renewal" in logs and "lost its permit" not in logs
    assert exits == 0
