"""A hold given back after an outage that was no longer ours is reported as such, not
as given back (#29 item 3 follow-up), on an in-process worker and a lock Redis of its
own that the test kills while the runs go on and starts again empty.

The runs end while Redis is down: their releases fail and :mod:`.giveback` tries them
again. The server comes back without the leases (a restart that lost its data), so the
tries answer "not ours". Before, the give-back thread logged "gave back <PermitHold
...>" (and "<SingletonHold ...>") for them all the same, beside the leases' own
report that they were lost "while running".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

from celery_redislock import RedisLock, SingletonTask, bounded_task
from celery_redislock.celery import giveback
from celery_redislock.celery.signals import lease_lost
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.testing import RedisServer

from .conftest import MakeApp
from .helpers import wait_until

TTL = 30.0  # far longer than the test: the give-back never gives up on expiry


def test_a_hold_lost_before_it_could_be_given_back_is_reported_lost(
    make_app: MakeApp, worker: Any, capture: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_redislock")
    lost = capture(lease_lost)
    started, proceed = threading.Barrier(3), threading.Event()
    with RedisServer() as lock_server:
        app = make_app(
            redislock_url=lock_server.url,
            redislock_client_options={"socket_timeout": 1, "socket_connect_timeout": 0.5},
        )

        @bounded_task(app=app, concurrency_limit=1, lock_ttl=TTL)
        def call() -> str:
            started.wait(10)
            proceed.wait(10)
            return "done"

        @app.task(base=SingletonTask, lock_ttl=TTL)
        def single() -> str:
            started.wait(10)
            proceed.wait(10)
            return "done"

        worker(app, concurrency=2)
        results = [call.delay(), single.delay()]
        started.wait(10)
        lock_server.kill()  # the leases go with it
        proceed.set()  # the runs end in the outage: their releases fail
        assert [r.get(timeout=20) for r in results] == ["done", "done"]
        wait_until(lambda: giveback.pending() == 2, timeout=20, what="two holds to give back")
        lock_server.start()  # empty: the leases are not ours any more
        wait_until(lambda: giveback.pending() == 0, timeout=20, what="the tries settled")
    messages = [r.getMessage() for r in caplog.records if "give" in r.getMessage()]
    assert not [m for m in messages if "gave back" in m], messages
    not_ours = [r for r in caplog.records if "was no longer held" in r.getMessage()]
    assert len(not_ours) == 2 and all(r.levelno == logging.ERROR for r in not_ours), messages
    assert {s["kind"] for s in lost} == {"permit", "lock"}, lost  # reported lost, once each
    lines = [r.getMessage() for r in caplog.records]
    assert not [m for m in lines if "while running" in m], lines  # they had ended
    assert len([m for m in lines if "no longer held when giving it back" in m]) == 2, lines


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "empty"])
def test_an_interval_lock_given_back_late_gets_its_interval_or_is_reported_lost(
    make_app: MakeApp, worker: Any, capture: Any, caplog: pytest.LogCaptureFixture, kept: bool
) -> None:
    """Mode ``interval``: the run's end sets the lock to expire ``singleton_interval``
    later. Its hand-over forgets the lease before its call, so a try again after the
    call failed was answered "not ours" without asking Redis, while it was still down
    (logged as given back, then as lost): the lock kept ``lock_ttl`` when Redis came
    back with its data, and a lock really lost was not reported."""
    caplog.set_level(logging.INFO, logger="celery_redislock")
    lost = capture(lease_lost)
    started, proceed = threading.Event(), threading.Event()
    with RedisServer() as lock_server:
        app = make_app(
            redislock_url=lock_server.url,
            redislock_restart_grace=False,  # the empty case: no lease put back
            redislock_client_options={"socket_timeout": 1, "socket_connect_timeout": 0.5},
        )

        @app.task(base=SingletonTask, lock_ttl=TTL, singleton_mode="interval", singleton_interval=5)
        def single() -> str:
            started.set()
            proceed.wait(10)
            return "done"

        worker(app, concurrency=1)
        result = single.delay()
        assert started.wait(10)
        locks = redis.Redis(port=lock_server.port, socket_timeout=2)
        if kept:
            locks.save()  # the lock as it was (held for TTL) comes back
        lock_server.kill()
        proceed.set()  # the run ends in the outage: its hand-over fails
        assert result.get(timeout=20) == "done"
        wait_until(lambda: "could not give back" in caplog.text, timeout=20, what="the failure")
        time.sleep(3 * giveback.INTERVAL)  # tries while Redis is down
        assert giveback.pending() == 1, "settled while the lock Redis was down"
        lock_server.start()
        wait_until(lambda: giveback.pending() == 0, timeout=20, what="the try settled")
        left = RedisLock(locks, call_key(single)).info()
    lines = [r.getMessage() for r in caplog.records]
    if kept:
        assert left.held and 0 < left.ttl_left <= 5.0, left  # its interval, not lock_ttl
        assert [m for m in lines if "gave back <SingletonHold" in m], lines
        assert not lost, lost
    else:
        assert not left.held
        assert [m for m in lines if "was no longer held" in m], lines
        assert [s["kind"] for s in lost] == ["lock"], lost
