"""A worker main SIGKILLed between an intake park's reply and the message's ack: the
message stays unacknowledged and the broker hands it out again (kombu's Redis transport
after ``visibility_timeout``; restored here at once, by tag, as ``restore_visible``
does). The copy re-sends a park Redis knows and is dropped: the run runs once, whether
it was parked or handed a permit at intake.

Real ``celery worker`` subprocesses; the kill is a test hook in the worker module (the
intake park is wrapped: after a park that went through, the main kills itself once).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from kombu import Connection

from celery_redislock.celery.bounded.parking import parking_for
from celery_redislock.core.keys import DEFAULT_PREFIX
from celery_redislock.core.parking import ParkingSemaphore

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
import os
import signal

from celery_redislock import bounded_task
from celery_redislock.core.parking import NOT_PARKED, ParkingSemaphore

_real_park = ParkingSemaphore.park


def _park_then_die(self, *args, **kwargs):
    position = _real_park(self, *args, **kwargs)
    if kwargs.get("intake") and position != NOT_PARKED and locks.delete("die-after-park"):
        os.kill(os.getpid(), signal.SIGKILL)  # after the park's reply, before the ack
    return position


ParkingSemaphore.park = _park_then_die


@bounded_task(app=app, concurrency_limit=1, concurrency_key="kill", lock_ttl=2)
def call(n):
    record("runs", str(n), 0)
"""
)


@pytest.mark.parametrize("handed_over", [False, True], ids=["parked", "handed-over"])
def test_a_message_redelivered_after_its_main_died_past_the_intake_park_runs_once(
    tmp_path: Path,
    redis_url: str,
    locks: redis.Redis,
    handed_over: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = AppModule(tmp_path, redis_url, BODY)
    # Loading the module here patches ParkingSemaphore.park in the test's own process
    # too; undone when the test ends. Left in place, every later intake park of the
    # xdist worker called the patch, whose client is on this module's own redis-server
    # -- stopped by then: ConnectionError, no run parked at intake (test_parking,
    # test_counts failed after this module on one worker).
    monkeypatch.setattr(ParkingSemaphore, "park", ParkingSemaphore.park)
    tasks = module.load()
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    sem = parking_for(tasks.app, "kill", 1, 2.0, DEFAULT_PREFIX)
    held = None if handed_over else sem.acquire(blocking=False, ttl=60)  # the run before
    locks.set("die-after-park", "1")
    with WorkerProcess(module, concurrency=1, name="a") as a:
        tasks.call.delay(1)
        assert a.process is not None
        a.process.wait(20)  # killed itself right after the intake park
    assert broker.hlen("unacked") == 1 and broker.llen(module.queue) == 0
    info = sem.parking_info()
    assert (info.parked, info.claimed) == ((0, 1) if handed_over else (1, 0))
    with WorkerProcess(module, concurrency=2, name="b"):
        with Connection(db_url(redis_url, BROKER_DB)) as conn:
            for tag in broker.hkeys("unacked"):  # what restore_visible does, per message
                conn.default_channel.qos.restore_by_tag(tag)
        wait_until(
            lambda: broker.hlen("unacked") == 0 and broker.llen(module.queue) == 0,
            what="the redelivered copy looked at and acknowledged",
        )
        if held is not None:
            assert sem.parking_info().parked == 1  # not parked a second time
            held.release()
        wait_until(lambda: runs(locks, "runs"), timeout=20, what="the run")
        wait_until(lambda: not sem.info().holders, timeout=10, what="its permit given back")
        info = sem.parking_info()
        assert info.parked + info.claimed + info.dead == 0
        assert [label for _, _, label in runs(locks, "runs")] == ["1"]
