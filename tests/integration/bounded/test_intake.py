"""Parking at intake (bounded/intake.py): a run that would be refused a permit is parked
by the worker's main process and never reaches a pool process; one that may go, and
every run that intake leaves alone (singleton, concurrency_wait), starts as before."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.guard import semaphore_for
from celery_redislock.celery.bounded.parking import SENT_HEADER
from celery_redislock.celery.signals import permit_acquired, permit_parked
from celery_redislock.core.parking import ParkingSemaphore

from ..helpers import wait_until
from ..workers import LOCKS_DB, db_url
from .helpers import holders


def _lot(app: Celery) -> ParkingSemaphore:
    task = next(app.tasks[n] for n in app.tasks if n.endswith(".call"))
    return semaphore_for(task, "api", 1, 30.0, "redislock", {})


def _start_busy(app: Celery, locks: redis.Redis, worker: Any, call: Any) -> Any:
    """Start a worker (2 processes) and run 0 of ``call``; its result once it holds the
    pool's permit."""
    worker(app, concurrency=2)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="the first run's permit")
    return first


def test_a_run_refused_at_intake_never_reaches_a_pool_process(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="celery")
    prerun, parked = capture(task_prerun), capture(permit_parked)
    proceed = threading.Event()
    sent: list[float] = []

    @bounded_task(app=app, bind=True, concurrency_limit=1, concurrency_key="api")
    def call(self: Any, n: int) -> int:
        sent.append(float(self.request.headers[SENT_HEADER]))
        if n == 0:
            proceed.wait(10)
        return n

    first = _start_busy(app, locks, worker, call)
    others = [call.delay(n) for n in range(1, 4)]
    wait_until(lambda: len(parked) == 3, what="three runs parked")
    started = {p["task_id"] for p in prerun if p["sender"].name == call.name}
    assert started <= {first.id}  # no parked run went to a pool process
    assert [p["position"] for p in parked] == [1, 2, 3]
    proceed.set()
    assert [r.get(timeout=15) for r in [first, *others]] == [0, 1, 2, 3]
    assert sent == sorted(sent)  # FIFO, by sending time
    for result in others:  # Celery logs no "ignored" line, and one "received" line
        lines = [r.getMessage() for r in caplog.records if result.id in r.getMessage()]
        assert not [line for line in lines if "ignored" in line]


def test_an_intake_park_whose_reply_was_lost_parks_the_run_once(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any, monkeypatch: Any
) -> None:
    acquired = capture(permit_acquired)
    proceed = threading.Event()
    real_park = ParkingSemaphore.park

    def reply_lost(self: ParkingSemaphore, *args: Any, **kwargs: Any) -> int:
        position = real_park(self, *args, **kwargs)
        if kwargs.get("intake"):
            raise redis.ConnectionError("the reply was lost")
        return position

    monkeypatch.setattr(ParkingSemaphore, "park", reply_lost)
    runs: list[int] = []

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        runs.append(n)
        if n == 0:
            proceed.wait(10)
        return n

    first = _start_busy(app, locks, worker, call)
    second = call.delay(1)  # parked on intake; the run re-sends the same park
    wait_until(lambda: _lot(app).parking_info().parked == 1, what="the run parked")
    proceed.set()
    assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    time.sleep(0.5)
    assert runs == [0, 1] and len(acquired) == 2  # once each, not parked round and round
    assert _lot(app).parking_info().parked == 0 and _lot(app).parking_info().claimed == 0


def test_a_run_parked_at_intake_keeps_its_message(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    parked = capture(permit_parked)
    proceed = threading.Event()
    seen: list[tuple[Any, ...]] = []

    @bounded_task(app=app, bind=True, concurrency_limit=1, concurrency_key="api")
    def call(self: Any, n: int, *, word: str = "") -> int:
        seen.append((n, word, self.request.headers.get("x-tenant"), self.request.retries))
        if n == 0:
            proceed.wait(10)
        return n

    @app.task
    def after(result: int) -> None:
        seen.append(("after", result))

    first = _start_busy(app, locks, worker, call)
    second = call.apply_async(
        (1,), {"word": "w"}, headers={"x-tenant": "t1"}, retries=2, link=after.s()
    )
    wait_until(lambda: len(parked) == 1, what="the run parked")
    proceed.set()
    assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    wait_until(lambda: ("after", 1) in seen, what="the link")
    assert (1, "w", "t1", 2) in seen


def test_a_lock_redis_that_stops_answering_stalls_the_worker_main_briefly(
    make_app: Any, worker: Any, fault_proxy: Any
) -> None:
    """Intake runs in the worker's main process: a lock Redis that holds its replies
    (a stopped server, a stalled network) must not hold every other message of the
    worker behind each bounded one for the client's socket timeout (5 s)."""
    app = make_app(redislock_url=db_url(fault_proxy.url, LOCKS_DB), worker_prefetch_multiplier=8)

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        return n

    @app.task(shared=False)
    def plain(n: int) -> int:
        return n

    worker(app, concurrency=4)
    assert call.delay(0).get(timeout=10) == 0  # the main's lock connection is made
    fault_proxy.pause()
    try:
        bounded = [call.delay(n) for n in range(3)]
        started = time.monotonic()
        assert plain.delay(7).get(timeout=30) == 7
        stalled = time.monotonic() - started
    finally:
        fault_proxy.resume()
    assert [r.get(timeout=30) for r in bounded] == [0, 1, 2]
    assert stalled < 8.0, f"the worker's main was held {stalled:.1f} s behind three intakes"


def test_a_message_with_an_eta_is_looked_at_when_it_comes_due(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    parked, prerun = capture(permit_parked), capture(task_prerun)
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        if n == 0:
            proceed.wait(10)
        return n

    first = _start_busy(app, locks, worker, call)
    sent = time.monotonic()
    # expires: Celery asks whether it was revoked on receipt too, long before it is due
    later = call.apply_async((1,), countdown=1.0, expires=60)
    wait_until(lambda: parked, what="the run parked when due")
    assert time.monotonic() - sent >= 0.9
    assert later.id not in {p["task_id"] for p in prerun}  # parked at intake
    proceed.set()
    assert first.get(timeout=10) == 0 and later.get(timeout=10) == 1
