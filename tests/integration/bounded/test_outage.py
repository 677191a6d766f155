"""No bounded run lost to a Redis outage or a killed worker, on real ``celery worker``
processes (prefork) and a private redis-server that the test stops and restarts.

Every run appends ``"<start> <end> <task id>"`` to a file (not to Redis, which is down
part of the time); an interval sweep over those lines must never exceed the limit,
each task sent must have run exactly once, no worker may exit, and at the end no
permit is held and nothing is parked or claimed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_redislock.core.journal import ParkJournal
from celery_redislock.core.keys import DEFAULT_PREFIX
from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.testing import RedisServer

from ..helpers import wait_until
from ..workers import BROKER_DB, LOCKS_DB, AppModule, WorkerProcess, db_url, side_by_side
from .helpers import peak

pytestmark = pytest.mark.slow

LIMIT = 2

BODY = """
from celery_redislock import bounded_task

RECORDS = {records!r}


@bounded_task(app=app, bind=True, concurrency_limit={limit}, concurrency_key="api", lock_ttl=5)
def call(self, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(RECORDS, "a") as out:
        out.write(f"{{start}} {{time.time()}} {{self.request.id}}\\n")
"""

CONF = """{
    "task_ignore_result": True,
    "redislock_park_sweep_interval": 0.5,
    "redislock_client_options": {"socket_timeout": 2, "socket_connect_timeout": 1},
    "broker_connection_max_retries": None,
    "worker_prefetch_multiplier": 1,
}"""


def _runs(records: Path) -> list[tuple[float, float, str]]:
    if not records.exists():
        return []
    rows = (line.split() for line in records.read_text().splitlines() if line.strip())
    return sorted((float(start), float(end), task_id) for start, end, task_id in rows)


def _module(tmp_path: Path, url: str, locks_url: str | None = None) -> tuple[AppModule, Path]:
    records = tmp_path / "runs.txt"
    module = AppModule(tmp_path, url, BODY.format(records=str(records), limit=LIMIT), conf=CONF)
    if locks_url is not None:  # a lock Redis of its own
        source = module.path.read_text().replace(db_url(url, LOCKS_DB), locks_url)
        module.path.write_text(source)
    return module, records


def _send(task: Any, n: int, seconds: float = 0.2) -> list[str]:
    """Send ``n`` runs; the ids of those whose ``delay()`` succeeded."""
    sent = []
    for _ in range(n):
        with contextlib.suppress(Exception):  # the broker is down: delay() raises
            sent.append(task.apply_async((seconds,), retry=False).id)
    return sent


def _stop_keeping_data(server: RedisServer) -> None:
    """Stop the server as an orderly shutdown does, writing its data to disk."""
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis(port=server.port).shutdown(save=True)
    assert server.process is not None
    server.process.wait(10)
    server.process = None


def _settled(locks: redis.Redis, prefix: str = DEFAULT_PREFIX) -> ParkingSemaphore:
    sem = ParkingSemaphore(locks, "api", limit=LIMIT, prefix=prefix)
    wait_until(
        lambda: (
            not sem.info().holders
            and sem.parking_info().parked == 0
            and sem.parking_info().claimed == 0
        ),
        timeout=15,
        what="no permit held, nothing parked or claimed",
    )
    return sem


def _check(records: Path, sent: list[str], workers: list[WorkerProcess]) -> None:
    done = _runs(records)
    counts = Counter(task_id for _, _, task_id in done)
    assert sorted(counts) == sorted(sent), "every task sent ran"
    assert max(counts.values()) == 1, "none ran twice"
    assert peak(done) <= LIMIT
    for worker in workers:
        assert worker.process is not None and worker.process.poll() is None, worker.log()[-3000:]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


def test_shared_redis_stopped_30s_loses_no_run(tmp_path: Path, server: RedisServer) -> None:
    module, records = _module(tmp_path, server.url)
    workers = [WorkerProcess(module, concurrency=4, name=n) for n in ("a", "b")]
    with side_by_side(*workers):
        tasks = module.load()
        sent = _send(tasks.call, 24)
        wait_until(lambda: len(_runs(records)) >= 4, timeout=20, what="a few runs")
        _stop_keeping_data(server)  # runs running, parked and claimed at this moment
        stopped = time.monotonic()
        time.sleep(2)
        sent += _send(tasks.call, 3)  # while down: these delay() calls fail
        time.sleep(max(0.0, 30 - (time.monotonic() - stopped)))
        server.start()
        sent += _send(tasks.call, 6)
        wait_until(lambda: len(_runs(records)) >= len(sent), timeout=60, what="every run sent")
        locks = redis.Redis.from_url(db_url(server.url, LOCKS_DB))
        _settled(locks)
        time.sleep(1)  # nothing runs twice late
        _check(records, sent, workers)


def test_lock_redis_restarted_empty_loses_no_run(tmp_path: Path, redis_url: str) -> None:
    """The lock Redis (a server of its own) is killed while runs are running, parked
    and claimed, and comes back empty: the parked runs are parked again from the park
    journal in the broker's Redis, every task runs exactly once, the limit holds."""
    with RedisServer() as lock_server:
        module, records = _module(tmp_path, redis_url, locks_url=lock_server.url)
        prefix = f"o{module.name[-8:]}"  # a journal of its own on the shared broker
        source = module.path.read_text().replace(
            '"task_ignore_result": True,',
            f'"task_ignore_result": True, "redislock_prefix": "{prefix}",',
        )
        module.path.write_text(source)
        workers = [WorkerProcess(module, concurrency=2, name=n) for n in ("a", "b")]
        with side_by_side(*workers):
            tasks = module.load()
            locks = redis.Redis.from_url(lock_server.url)
            sem = ParkingSemaphore(locks, "api", limit=LIMIT, prefix=prefix)
            # Runs of 1 s: those running when the server dies end while it is down (a
            # permit the new server never knew would let one more run beside them).
            sent = _send(tasks.call, 10, seconds=1.0)
            wait_until(lambda: sem.parking_info().parked >= 4, timeout=20, what="runs parked")
            parked = [owner for _, _, owner in sem.parking_info(count=100).head]
            lock_server.kill()  # runs running, parked and claimed at this moment
            sent += _send(tasks.call, 4)  # the broker is up: these start and wait
            time.sleep(3)
            lock_server.start()  # empty
            sent += _send(tasks.call, 4)
            wait_until(lambda: len(_runs(records)) >= len(sent), timeout=60, what="every run sent")
            settled = _settled(redis.Redis.from_url(lock_server.url), prefix)
            time.sleep(1)  # nothing runs twice late
            _check(records, sent, workers)
            assert set(parked) <= {task_id for _, _, task_id in _runs(records)}
            logs = workers[0].log() + workers[1].log()
            assert "cannot reach the lock Redis" in logs
            assert "parked again from the park journal" in logs and "are lost" not in logs
            journal = ParkJournal(redis.Redis.from_url(db_url(redis_url, BROKER_DB)), prefix)
            assert len(journal) == 0, "every journaled run started"
            assert settled.info().holders == []


def test_a_worker_killed_while_its_runs_are_parked(tmp_path: Path, server: RedisServer) -> None:
    module, records = _module(tmp_path, server.url)
    a = WorkerProcess(module, concurrency=4, name="a")
    b = WorkerProcess(module, concurrency=4, name="b")
    with side_by_side(a, b):
        tasks = module.load()
        sent = _send(tasks.call, 16, seconds=0.3)
        locks = redis.Redis.from_url(db_url(server.url, LOCKS_DB))
        sem = ParkingSemaphore(locks, "api", limit=LIMIT)
        wait_until(lambda: sem.parking_info().parked >= 6, timeout=20, what="runs parked")
        parked = [owner for _, _, owner in sem.parking_info(count=100).head]
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # the main process: its children follow
        a.process.wait(5)
        broker = redis.Redis.from_url(db_url(server.url, BROKER_DB))
        at_kill = _unacked(broker)  # a's prefetched messages (and b's of the moment)
        wait_until(
            lambda: set(parked) <= {t for _, _, t in _runs(records)},
            timeout=40,
            what="every run parked when the worker died",
        )
        _settled(locks)
        done = Counter(task_id for _, _, task_id in _runs(records))
        assert max(done.values()) == 1 and peak(_runs(records)) <= LIMIT
        assert set(parked) <= set(done)  # every parked run ran, exactly once

        # Only what the killed worker held is lost, as with plain Celery: the messages
        # its main had prefetched, still unacknowledged (kombu restores them only after
        # the visibility timeout), the runs its children had accepted (acknowledged on
        # accept) when they died with it: at most one per child, and at most one message
        # its BRPOP had taken off the queue but not yet put in the unacked hash (kombu's
        # Redis transport does the two apart): never received, never unacknowledged.
        def lost() -> tuple[set[str], set[str]]:
            """(a's prefetched messages, runs a's children had accepted) never run."""
            missing = set(sent) - {t for _, _, t in _runs(records)}
            orphans = missing & _unacked(broker)
            return orphans, missing - orphans

        def accounted() -> bool:
            (orphans, killed), by_b = lost(), _received(b.log())
            return orphans <= at_kill and not (orphans | killed) & by_b  # b ran its own

        wait_until(accounted, timeout=20, what="b ran every message it received")
        orphans, killed = lost()
        assert orphans <= at_kill and not (orphans | killed) & _received(b.log())
        in_flight = killed - _received(a.log())
        assert len(killed - in_flight) <= 4 and len(in_flight) <= 1, (killed, orphans)
        assert b.process is not None and b.process.poll() is None


def _unacked(broker: redis.Redis) -> set[str]:
    """Task ids in kombu's Redis transport ``unacked`` hash (tag -> [message, ...])."""
    return {json.loads(raw)[0]["headers"]["id"] for raw in broker.hvals("unacked")}


def _received(log: str) -> set[str]:
    return set(re.findall(r"\[([0-9a-f-]{36})\] received", log))
