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
from typing import Any

import pytest

from celery_redislock import SingletonTask, bounded_task
from celery_redislock.celery import giveback
from celery_redislock.celery.signals import lease_lost
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
