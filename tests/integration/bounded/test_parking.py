"""Parking (the default over the limit) with real in-process workers on a real Redis:
refused runs wait in the pool's FIFO queue and are published by the release that frees
a permit; order, signals, state, retries, singleton locks kept while parked, a second
message of a parked run skipped, an undecodable entry dead-lettered, a lowered limit."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from celery import Celery

from celery_redislock import bounded_task, singleton_task
from celery_redislock.celery.bounded.guard import semaphore_for
from celery_redislock.celery.bounded.parking import PARK_HEADER, decode_message
from celery_redislock.celery.signals import (
    permit_acquired,
    permit_duplicate,
    permit_parked,
    permit_rescheduled,
)
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import parse_owner
from celery_redislock.core.parking import ParkingSemaphore, new_entry_id

from ..conftest import MakeApp
from ..helpers import lock_info, wait_until
from .helpers import busy_and_parking_singleton, gated_call, holders, peak


def _lot(app: Celery, pool: str = "api") -> ParkingSemaphore:
    return semaphore_for(
        app.tasks[next(iter(n for n in app.tasks if "call" in n))], pool, 1, 30.0, "redislock", {}
    )


def test_parked_runs_are_published_in_order_by_the_release(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    caplog.set_level(logging.DEBUG, logger="celery_redislock")  # last: the handler's level
    parked, acquired = capture(permit_parked), capture(permit_acquired)
    rescheduled = capture(permit_rescheduled)
    order: list[int] = []
    proceed = threading.Event()

    @bounded_task(
        app=app,
        bind=True,
        concurrency_limit=1,
        concurrency_key="api",
        max_retries=0,
        concurrency_standby=0,
    )
    def call(self: Any, n: int) -> tuple[int, int]:
        order.append(n)
        if n == 0:
            proceed.wait(10)
        return n, self.request.retries

    worker(app, concurrency=4)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="the first run's permit")
    others = []
    for n in range(1, 5):
        others.append(call.delay(n))
        wait_until(lambda n=n: len(parked) == n, what=f"run {n} parked")
    lot = _lot(app)
    info = lot.parking_info(count=10)
    assert info.parked == 4 and [row[2] for row in info.head] == [r.id for r in others]
    assert [p["position"] for p in parked] == [1, 2, 3, 4]
    assert all(r.state == "PENDING" for r in others)
    time.sleep(0.3)
    assert len(parked) == 4  # nothing polls: no re-publish while parked
    proceed.set()
    assert [r.get(timeout=10) for r in [first, *others]] == [[n, 0] for n in range(5)]
    assert order == [0, 1, 2, 3, 4]  # FIFO
    assert not rescheduled
    waited = {a["task_id"]: a["waited"] for a in acquired}
    assert waited[first.id] < 0.5 and waited[others[-1].id] >= 0.3
    assert lot.parking_info().parked == 0 and lot.parking_info().claimed == 0
    assert not holders(locks, "api")
    for result in others:  # one DEBUG line when parked, one INFO when released
        lines = [r for r in caplog.records if result.id in r.getMessage()]
        assert [r.levelname for r in lines if "parked at place" in r.getMessage()] == ["DEBUG"]
        assert [
            r.levelname for r in lines if "released from the parked queue" in r.getMessage()
        ] == ["INFO"]
        assert not [r for r in lines if "ignored" in r.getMessage()]  # Celery's line


def test_a_parked_singleton_keeps_its_lock(app: Celery, locks: redis.Redis, worker: Any) -> None:
    proceed = threading.Event()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_standby=0)
    def call() -> str:
        proceed.wait(10)
        return "busy"

    @singleton_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_standby=0)
    def sync(user: int) -> int:
        return user

    worker(app, concurrency=3)
    busy = call.delay()
    wait_until(lambda: holders(locks, "api"), what="the busy run")
    first = sync.delay(7)
    key = call_key(sync, (7,), {}, {})
    wait_until(lambda: _lot(app).parking_info().parked == 1, what="the singleton parked")
    info = lock_info(locks, key)
    assert info.held and parse_owner(info.holders[0].owner)[0] == first.id
    assert sync.delay(7).id == first.id  # still one job while parked
    proceed.set()
    assert busy.get(timeout=10) == "busy" and first.get(timeout=10) == 7
    wait_until(lambda: not lock_info(locks, key).held, what="the singleton lock released")


def test_a_second_message_of_a_parked_run_never_runs(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    duplicates = capture(permit_duplicate)
    runs: list[str] = []
    proceed = threading.Event()
    published: list[bytes] = []

    @bounded_task(
        app=app, bind=True, concurrency_limit=1, concurrency_key="api", concurrency_standby=0
    )
    def call(self: Any, n: int) -> int:
        runs.append(self.request.id)
        if n == 0:
            proceed.wait(10)
        return n

    worker(app, concurrency=3)
    first = call.delay(0)
    wait_until(lambda: holders(locks, "api"), what="the first run")
    second = call.delay(1)
    lot = _lot(app)
    wait_until(lambda: lot.parking_info().parked == 1, what="the second parked")
    on_claimed = lot.on_claimed
    assert on_claimed is not None

    def twice(sem: ParkingSemaphore, claimed: list[Any]) -> None:
        published.extend(entry.payload for entry in claimed)
        on_claimed(sem, claimed)
        on_claimed(sem, claimed)  # e.g. a sweeper re-published it meanwhile

    lot.on_claimed = twice
    try:
        proceed.set()
        assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
        wait_until(lambda: duplicates, what="the second message skipped")
    finally:
        lot.on_claimed = on_claimed
    assert runs.count(second.id) == 1 and duplicates[0]["task_id"] == second.id
    name, args, _, options = decode_message(app, published[0])
    assert (name, args, options["task_id"]) == (call.name, [1], second.id)
    assert PARK_HEADER in options["headers"]


def test_an_undecodable_entry_is_dead_lettered_and_the_queue_goes_on(
    app: Celery, locks: redis.Redis, worker: Any, caplog: Any
) -> None:
    proceed, call, first = gated_call(app, locks, worker, concurrency_standby=0)
    lot = _lot(app)
    lot.park(new_entry_id(), b"RLP1 application/x-foreign binary\n\x00\x01", owner="foreign-1")
    second = call.delay(1)
    wait_until(lambda: lot.parking_info().parked == 2, what="the second parked")
    proceed.set()
    assert first.get(timeout=10) == 0 and second.get(timeout=10) == 1
    ((_, _, reason, payload),) = lot.dead_letters()
    assert payload.startswith(b"RLP1 application/x-foreign") and "foreign" in reason
    assert "parked run foreign-1 of pool 'api' cannot be decoded" in caplog.text
    assert lot.parking_info().dead == 1


def test_a_lowered_limit_drains_at_the_new_limit(
    make_app: MakeApp, locks: redis.Redis, worker: Any
) -> None:
    app = make_app()
    spans: list[tuple[float, float]] = []
    gate = threading.Event()

    @bounded_task(app=app, concurrency_limit=3, concurrency_key="api", concurrency_standby=0)
    def call(n: int) -> None:
        start = time.time()
        if n < 3:
            gate.wait(10)
        else:
            time.sleep(0.2)
        spans.append((start, time.time()))

    worker(app, concurrency=6)
    held = [call.delay(n) for n in range(3)]
    wait_until(lambda: len(holders(locks, "api")) == 3, what="three permits")
    queued = [call.delay(n) for n in range(3, 7)]
    wait_until(lambda: _lot(app).parking_info().parked == 4, what="four parked")
    app.conf.redislock_concurrency_limits = {"api": 1}
    call.delay(99).forget()  # a run under the new configuration stores limit 1
    wait_until(lambda: _lot(app).parking_info().parked == 5, what="the fifth parked")
    gate.set()
    for result in [*held, *queued]:
        result.get(timeout=20)
    assert peak(sorted(spans)[3:]) == 1  # after the running three: one at a time


def test_a_standby_waits_in_place_and_gets_the_permit_from_the_release(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    parked, acquired = capture(permit_parked), capture(permit_acquired)
    proceed, call, first = gated_call(app, locks, worker, 4, concurrency_standby=1)
    others = [call.delay(n) for n in (1, 2)]
    wait_until(lambda: len(parked) == 2, what="both parked")
    lot = _lot(app)
    # The oldest was published ahead and waits in place; the other stays parked.
    wait_until(lambda: locks.zcard(lot.keys.queue) == 1, what="the standby waiting")
    assert lot.parking_info().parked == 1
    proceed.set()
    assert [r.get(timeout=10) for r in [first, *others]] == [0, 1, 2]
    assert not holders(locks, "api") and lot.parking_info().parked == 0
    assert {a["task_id"] for a in acquired} == {first.id, *(r.id for r in others)}


def test_a_parked_run_of_mode_until_and_while_executing_runs_when_released(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    # The parked message names the running lease it was handed (on_park); in this mode
    # the token header is read as the *queued* lock's, so the run found its own running
    # lock held, was re-sent as "the queued copy" and never ran while lock_queued_ttl lasted.
    proceed, busy, sync = busy_and_parking_singleton(app, locks, worker)
    first = sync.delay(7)
    key = call_key(sync, (7,), {}, {})
    wait_until(lambda: _lot(app).parking_info().parked == 1, what="the singleton parked")
    assert lock_info(locks, key).held  # kept while parked
    proceed.set()
    assert busy.get(timeout=10) == "busy" and first.get(timeout=15) == 7
    wait_until(lambda: not lock_info(locks, key).held, what="the singleton lock released")
    wait_until(lambda: not holders(locks, "api"), what="the permit released")
    assert _lot(app).parking_info().claimed == 0


def test_a_parked_run_that_expired_hands_its_reserved_permit_on(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    # A parked run whose message expired (or was revoked) never takes the permit the
    # release reserved for it: it was held idle for lock_ttl (30 s), then the entry went
    # back to its place and was claimed, published and revoked again, round after round.
    proceed, call, busy = gated_call(app, locks, worker, concurrency_standby=0)
    expiring = call.apply_async((1,), expires=1.0)
    wait_until(lambda: _lot(app).parking_info().parked == 1, what="run 1 parked")
    last = call.delay(2)
    wait_until(lambda: _lot(app).parking_info().parked == 2, what="run 2 parked")
    time.sleep(1.5)  # run 1's message expires while parked
    proceed.set()
    assert busy.get(timeout=10) == 0
    assert last.get(timeout=10) == 2  # not after run 1's reservation lapsed (30 s)
    assert expiring.state == "REVOKED"
    wait_until(lambda: not holders(locks, "api"), what="the permit released")
    info = _lot(app).parking_info()
    assert (info.parked, info.claimed) == (0, 0)  # run 1 is not coming back


def test_a_parked_singleton_that_expired_lets_its_lock_go(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    # In mode until_and_while_executing the parked message names the running lease it
    # was handed; the revoke cleanup released that token on the queued lock only, so
    # the signature stayed locked for lock_queued_ttl after its parked run expired.
    proceed, busy, sync = busy_and_parking_singleton(app, locks, worker)
    expiring = sync.apply_async((7,), expires=1.0)
    key = call_key(sync, (7,), {}, {})
    wait_until(lambda: _lot(app).parking_info().parked == 1, what="the singleton parked")
    time.sleep(1.5)  # its message expires while parked
    proceed.set()
    assert busy.get(timeout=10) == "busy"
    wait_until(lambda: expiring.state == "REVOKED", what="the parked run revoked")
    wait_until(
        lambda: not lock_info(locks, key).held, timeout=5, what="the singleton lock released"
    )
