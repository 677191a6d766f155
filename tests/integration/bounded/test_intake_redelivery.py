"""Parking at intake and redelivery: a message the broker hands out again (a worker
main killed between the intake park and the ack; kombu's Redis transport restores it
after ``visibility_timeout``, AMQP redelivers it at once) must not park -- and run --
its run a second time. A redelivery is presented here as the same message published
twice (same body, headers and properties), which is what a worker sees either way."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.guard import semaphore_for
from celery_redislock.celery.bounded.journal import journal_for
from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.testing import RedisServer

from ..helpers import wait_until
from ..own_redis import own_redis_url  # noqa: F401 (the fixture redis_url)
from .helpers import holders

# Not serial: in-process workers on a Redis of the module's own (own_redis); every
# wait a wait_until on a state, no bound on a duration.


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


def _keep_sent(app: Celery, monkeypatch: Any) -> Callable[[int], None]:
    """Keep every message the app publishes; answers ``deliver_again(i)``, which hands
    the i-th of them to the broker once more, unchanged (as a redelivery)."""
    real = app.amqp.send_task_message
    sent: list[tuple[Any, ...]] = []

    def keep(producer: Any, name: str, message: Any, **kwargs: Any) -> Any:
        sent.append((name, message, kwargs))
        return real(producer, name, message, **kwargs)

    def deliver_again(index: int) -> None:
        name, message, kwargs = sent[index]
        with app.producer_or_acquire() as producer:
            real(producer, name, message, **kwargs)

    monkeypatch.setattr(app.amqp, "send_task_message", keep)
    return deliver_again


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


def test_a_copy_delivered_after_its_run_leaves_no_journal_record(
    make_app: Any, locks: redis.Redis, worker: Any, monkeypatch: Any
) -> None:
    # The journal (the broker's Redis, another server than the lock Redis) is written
    # before the park; a copy whose token was taken already must not leave its record
    # there: a lock Redis losing its data later would park that run again.
    with RedisServer() as lock_server:
        app = make_app(redislock_url=lock_server.url, redislock_restart_grace=False)
        runs: list[int] = []
        proceed = threading.Event()
        call = _gated(app, runs, proceed)
        deliver_again = _keep_sent(app, monkeypatch)
        worker(app, concurrency=2)
        first = call.delay(0)
        lot = _lot(call)
        wait_until(lambda: lot.info().holders, what="the first run's permit")
        second = call.delay(1)  # parked at intake (journaled), then runs
        wait_until(lambda: lot.parking_info().parked == 1, what="the run parked")
        proceed.set()
        assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
        wait_until(lambda: not lot.info().holders, what="the permit back")
        journal = journal_for(app)
        assert journal is not None and len(journal) == 0
        proceed.clear()
        third = call.delay(0)  # busy again, so the copy below would be parked
        wait_until(lambda: lot.info().holders, what="the third run's permit")
        deliver_again(1)  # run 1's message, delivered again
        wait_until(lambda: _all_acked(app), what="the copy looked at on intake")
        assert lot.parking_info().parked == 0 and len(journal) == 0
        proceed.set()
        assert third.get(timeout=10) == 0
        wait_until(lambda: not lot.info().holders, what="the permit back")
        assert sorted(runs) == [0, 0, 1], runs


def test_an_acks_late_run_parked_in_its_process_delivered_again_runs_once(
    app: Celery, locks: redis.Redis, worker: Any, monkeypatch: Any
) -> None:
    # acks_late: a run refused in before_start is parked from its pool process and its
    # message acknowledged only after that; delivered again (its main killed before
    # the ack), the copy parks under the same token on intake and changes nothing.
    runs: list[int] = []
    held: list[Any] = []

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", acks_late=True)
    def call(n: int) -> int:
        runs.append(n)
        return n

    lot = _lot(call)

    def take_the_permit(task: Any = None, **_: Any) -> None:
        # After intake let the run go, before its before_start.
        if getattr(task, "name", None) == call.name and not held:
            held.append(lot.acquire(blocking=False))

    task_prerun.connect(take_the_permit, weak=False)
    try:
        deliver_again = _keep_sent(app, monkeypatch)
        worker(app, concurrency=2)
        first = call.delay(1)
        wait_until(
            lambda: lot.parking_info().parked == 1 and _all_acked(app),
            what="the run parked from its process, its message acknowledged",
        )
        assert held and held[0] is not None
        deliver_again(0)  # the same message, delivered again
        wait_until(lambda: _all_acked(app), what="the copy looked at on intake")
        assert lot.parking_info().parked == 1  # not parked a second time
        held[0].release()
        assert first.get(timeout=10) == 1
        _drained(locks, call)
        assert runs == [1]
    finally:
        task_prerun.disconnect(take_the_permit)
