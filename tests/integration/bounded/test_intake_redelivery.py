"""Parking at intake and redelivery: a message the broker hands out again (a worker
main killed between the intake park and the ack; kombu's Redis transport restores it
after ``visibility_timeout``, AMQP redelivers it at once) must not park -- and run --
its run a second time. A redelivery is presented here as the same message published
twice (same body, headers and properties), which is what a worker sees either way."""

from __future__ import annotations

import threading
from typing import Any

import redis
from celery import Celery

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.guard import semaphore_for
from celery_redislock.core.parking import ParkingSemaphore

from ..helpers import wait_until
from .helpers import holders


def _lot(task: Any) -> ParkingSemaphore:
    return semaphore_for(task, "api", 1, 30.0, "redislock", {})


def _publish_twice(app: Celery, monkeypatch: Any, task_name: str) -> None:
    """Every message of ``task_name`` goes to the broker twice, unchanged."""
    real = app.amqp.send_task_message

    def twice(producer: Any, name: str, message: Any, **kwargs: Any) -> Any:
        if name == task_name:
            real(producer, name, message, **kwargs)
        return real(producer, name, message, **kwargs)

    monkeypatch.setattr(app.amqp, "send_task_message", twice)


def _all_acked(app: Celery) -> bool:
    """Nothing left in the app's queue, nothing delivered and unacknowledged."""
    broker = redis.Redis.from_url(app.conf.broker_url)
    try:
        return broker.llen(app.conf.task_default_queue) == 0 and broker.hlen("unacked") == 0
    finally:
        broker.close()


def _gated(app: Celery, runs: list[int], proceed: threading.Event) -> Any:
    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:
        runs.append(n)
        if n == 0:
            proceed.wait(10)
        return n

    return call


def _drained(locks: redis.Redis, task: Any) -> None:
    lot = _lot(task)

    def drained() -> bool:
        info = lot.parking_info()
        return info.parked == 0 and info.claimed == 0 and not holders(locks, "api")

    wait_until(drained, what="the queue drained, the permit back")


def test_a_parked_message_delivered_twice_is_parked_once_and_runs_once(
    app: Celery, locks: redis.Redis, worker: Any, monkeypatch: Any
) -> None:
    runs: list[int] = []
    proceed = threading.Event()
    call = _gated(app, runs, proceed)
    worker(app, concurrency=2)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="the first run's permit")
    _publish_twice(app, monkeypatch, call.name)
    second = call.delay(1)
    wait_until(lambda: _all_acked(app), what="both copies looked at on intake")
    assert _lot(call).parking_info().parked == 1  # the second copy parked nothing
    proceed.set()
    assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    _drained(locks, call)
    assert sorted(runs) == [0, 1], runs


def test_a_handed_over_message_delivered_twice_runs_once(
    app: Celery, locks: redis.Redis, worker: Any, monkeypatch: Any
) -> None:
    runs: list[int] = []
    proceed = threading.Event()
    call = _gated(app, runs, proceed)
    _publish_twice(app, monkeypatch, call.name)
    worker(app, concurrency=2)
    first = call.delay(0)  # a permit is free: handed over on intake, twice
    wait_until(lambda: runs, what="the run started")
    wait_until(lambda: _all_acked(app), what="both copies looked at on intake")
    proceed.set()
    assert first.get(timeout=10) == 0
    _drained(locks, call)
    assert runs == [0]


def test_two_sends_under_one_task_id_are_two_runs(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    runs: list[int] = []
    proceed = threading.Event()
    call = _gated(app, runs, proceed)
    worker(app, concurrency=2)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="the first run's permit")
    again = [call.apply_async((1,), task_id="same-id") for _ in range(2)]
    wait_until(lambda: _all_acked(app), what="both sends looked at on intake")
    assert _lot(call).parking_info().parked == 2  # a user's second send is a new run
    proceed.set()
    assert first.get(timeout=10) == 0 and again[1].get(timeout=10) == 1
    _drained(locks, call)
    assert sorted(runs) == [0, 1, 1], runs
