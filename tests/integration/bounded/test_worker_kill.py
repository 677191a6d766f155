"""A parked run's re-published message lost with a SIGKILLed worker main (kombu takes a
message off the list before a pool process has it: a main killed then takes it along)
is published again when its reserved permit lapses, and runs once; the lost message,
restored by the broker later, is a duplicate and never runs.

Real ``celery worker`` subprocesses: worker A's only pool process is busy, so the
re-published message waits in A's main (received, unacknowledged) when A is
SIGKILLed; worker B then runs it. Once with the lock Redis kept, once with the lock
Redis (a server of its own) restarted empty after the kill: the park journal in the
broker's Redis still holds the claimed run (it is dropped only when the run starts).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from celery_redislock.celery.bounded.journal import journal_for, record
from celery_redislock.celery.bounded.parking import (
    PARK_HEADER,
    encode_message,
    parking_for,
    semaphore_spec,
)
from celery_redislock.core.keys import DEFAULT_PREFIX
from celery_redislock.core.parking import new_entry_id
from celery_redislock.testing import RedisServer

from ..helpers import wait_until
from ..own_redis import own_redis_url  # noqa: F401 (the fixture redis_url)
from ..workers import BROKER_DB, AppModule, WorkerProcess, db_url
from .helpers import RECORD, runs

# Not serial: one worker of one or two pool processes at a time, on a Redis of the
# module's own (own_redis); every wait a wait_until on a state, no bound on a duration.
pytestmark = pytest.mark.slow

BODY = (
    RECORD
    + """
from celery_redislock import bounded_task
from celery_redislock.celery.signals import permit_duplicate


@permit_duplicate.connect
def count_duplicates(sender=None, task_id=None, **kwargs):
    locks.incr(f"duplicate:{task_id}")


@bounded_task(app=app, concurrency_limit=1, concurrency_key="kill", lock_ttl=2,
              concurrency_standby=0)
def call(n):
    record("runs", str(n), 0)


@app.task
def hog(seconds):
    locks.set("hog", "1")
    time.sleep(seconds)
"""
)


@pytest.fixture
def lock_server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.mark.parametrize("restart", [False, True], ids=["lock-redis-kept", "restarted-empty"])
def test_a_republished_run_lost_with_a_killed_main_is_published_again_and_runs_once(
    tmp_path: Path,
    redis_url: str,
    locks: redis.Redis,
    lock_server: RedisServer,
    restart: bool,
) -> None:
    conf = f"{{'redislock_url': {lock_server.url!r}}}" if restart else "{}"
    module = AppModule(tmp_path, redis_url, BODY, conf=conf)
    tasks = module.load()
    app = tasks.app
    assert (journal_for(app) is not None) is restart  # the broker is another server
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(app, "kill", 1, 2.0, DEFAULT_PREFIX)  # publishes through the app
    held = sem.acquire(blocking=False, ttl=60)  # the run before: the only permit
    assert held is not None
    # Park run 1 as park_run does (journal first, then the lock Redis).
    entry_id, task_id = new_entry_id(), f"run-{time.time_ns()}"
    options = {"task_id": task_id, "headers": {PARK_HEADER: f"{entry_id} 0 {time.time()}"}}
    payload = encode_message(tasks.call, (1,), {}, options)
    record(app, entry_id, payload, spec=semaphore_spec(sem, 1), owner=task_id)
    assert sem.park(entry_id, payload, owner=task_id) == 1
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.hog.delay(60)
        wait_until(lambda: locks.get("hog"), what="A's only pool process busy")
        held.release()  # claims run 1 and publishes it: A's main takes it, and holds it
        wait_until(
            lambda: broker.llen(module.queue) == 0 and broker.hlen("unacked") == 1,
            what="the re-published message in A's main",
        )
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # its pool process dies with it
        a.process.wait(5)
    assert sem.parking_info().claimed == 1 and not runs(locks, "runs")
    if restart:
        lock_server.restart()  # empty: the claimed run is in the journal only
    with WorkerProcess(module, concurrency=2, name="b"):
        # The reservation lapses (lock_ttl 2 s): B's sweeper publishes run 1 again.
        wait_until(lambda: runs(locks, "runs"), timeout=20, what="run 1, published again")
        # The broker restores the lost message (here at once, not after an hour).
        with Connection(db_url(redis_url, BROKER_DB)) as conn:
            for tag in broker.hkeys("unacked"):  # what restore_visible does, per message
                conn.default_channel.qos.restore_by_tag(tag)
        wait_until(
            lambda: locks.get(f"duplicate:{task_id}"),
            timeout=10,
            what="the restored message skipped as a duplicate",
        )
        assert [label for _, _, label in runs(locks, "runs")] == ["1"]
        wait_until(lambda: broker.hlen("unacked") == 0, what="the duplicate acknowledged")
        wait_until(lambda: not sem.info().holders, what="its permit given back")
        info = sem.parking_info()
        assert info.parked + info.claimed + info.dead == 0
        journal = journal_for(app)
        assert journal is None or len(journal) == 0


STANDBY = (
    RECORD
    + """
from celery_redislock import bounded_task


@bounded_task(app=app, concurrency_limit=1, concurrency_key="kill", lock_ttl=2,
              concurrency_standby=1)
def call(n):
    record("runs", str(n), 0)
"""
)


def test_a_standby_killed_while_it_waits_in_place_is_published_again_and_runs_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # A standby (published ahead, no permit reserved) waits in place for the next
    # release. Its pool process dying with its main while it waits must leave its
    # entry claimed, to be published again when the claim lapses: it may not have
    # consumed its park token yet (it used to, and was lost).
    module = AppModule(tmp_path, redis_url, STANDBY)
    tasks = module.load()
    app = tasks.app
    sem = parking_for(app, "kill", 1, 2.0, DEFAULT_PREFIX, standby=1)
    held = sem.acquire(blocking=False, ttl=60)  # the run before: the only permit
    assert held is not None
    with WorkerProcess(module, concurrency=1, name="a") as a:
        entry_id, task_id = new_entry_id(), f"run-{time.time_ns()}"
        options = {"task_id": task_id, "headers": {PARK_HEADER: f"{entry_id} 0 {time.time()}"}}
        payload = encode_message(tasks.call, (1,), {}, options)
        assert sem.park(entry_id, payload, owner=task_id) == 0  # claimed ahead, published
        wait_until(lambda: locks.zcard(sem.keys.queue) == 1, what="the standby waiting")
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # its pool process dies with it
        a.process.wait(5)
    with WorkerProcess(module, concurrency=2, name="b"):
        held.release()
        wait_until(lambda: runs(locks, "runs"), timeout=20, what="the standby's run")
        wait_until(lambda: not sem.info().holders, what="its permit given back")
        info = sem.parking_info()
        assert info.parked + info.claimed + info.dead == 0
        assert [label for _, _, label in runs(locks, "runs")] == ["1"]
