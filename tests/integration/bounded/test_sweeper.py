"""The sweeper of a worker's main process: it hands on permits no release saw, puts
lapsed claims back, and says so (ERROR) when the lock Redis lost its parked runs."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.sweeper import Sweeper, sweep
from celery_redislock.core.parking import (
    _INFO,
    Parked,
    ParkingInfo,
    ParkingQueue,
    ParkingSemaphore,
    new_entry_id,
    pools_key,
)

from ...faults import FaultProxy
from ..conftest import MakeApp


def test_a_sweep_hands_on_an_expired_permit_and_reports_lost_data(
    make_app: MakeApp, locks: redis.Redis, caplog: Any
) -> None:
    app = make_app()

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call() -> None:  # pragma: no cover - never runs here
        pass

    published: list[Parked] = []
    sem = ParkingSemaphore(
        locks, "api", limit=1, ttl=0.2, on_claimed=lambda _, c: published.extend(c)
    )
    assert sem.acquire(blocking=False) is not None  # its holder dies: never released
    sem.park(new_entry_id(), b"RLP1 x y\n1")
    sem.park(new_entry_id(), b"RLP1 x y\n2")
    sweeper = Sweeper(app, 1.0)
    sweeper.tick()
    assert sem.parking_info().parked == 2  # the permit is still held
    time.sleep(0.3)  # the holder's lease expires; no release will come
    caplog.set_level(logging.ERROR, logger="celery_redislock")
    sweeper.tick()  # claims the head for the expired permit (its publish fails: bad)
    info = sem.parking_info()
    assert info.parked + info.claimed + info.dead == 2 and info.parked <= 1
    assert not [r for r in caplog.records if "lost its data" in r.getMessage()]
    locks.flushdb()  # the lock Redis restarted empty
    sweeper.tick()
    (lost,) = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert lost.levelname == "ERROR" and "the 1 run(s) parked or claimed" in lost.getMessage()


def test_a_pool_whose_sweep_fails_midway_is_swept_again(
    make_app: MakeApp, r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    """A sweep took a pool out of the set of pools with parked runs before it pumped
    the pool's queue, and put it back only when the pump answered. A pump that failed
    (the lock Redis stalled, a connection cut) left the pool out: no sweeper nor rate
    pump looked at it again, and its parked runs waited until some later run of that
    pool parked -- for a quiet pool, until their keys expired (lost)."""
    app = make_app(
        redislock_url=fault_proxy.url,
        redislock_prefix="swept",
        redislock_client_options={"socket_timeout": 0.3},
    )

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call() -> None:  # pragma: no cover - never runs here
        pass

    sem = ParkingSemaphore(r, "api", limit=1, ttl=1.0, prefix="swept")
    assert sem.acquire(blocking=False) is not None  # its holder dies: never released
    sem.park(new_entry_id(), b"RLP1 x y\n1")
    pools = pools_key("swept")
    assert r.sismember(pools, "api")
    fault_proxy.hold(b"EVALSHA")  # the pump's script call stalls: it times out
    try:
        with pytest.raises(redis.RedisError):
            sweep(app)
    finally:
        fault_proxy.release_held()  # what it held runs now: nothing is free to claim
    assert r.sismember(pools, "api"), "the pool was left out of the set of parked pools"
    time.sleep(1.1)  # the holder's lease expires; no release will come
    published, _ = sweep(app)
    assert published == 1  # the parked run is claimed for the expired permit


def _parked_after_the_pump(
    monkeypatch: pytest.MonkeyPatch, sem: ParkingSemaphore, then: Any
) -> None:
    """The sweeper's next pump finds the queue empty; right after it, another worker
    parks a run (the queue was empty: the park adds the pool to the set, where it is
    still), and ``then()`` sets up the fault."""
    pump = ParkingQueue.pump

    def pump_then_park(self: ParkingQueue) -> tuple[int, list[Parked]]:
        found = pump(self)
        monkeypatch.setattr(ParkingQueue, "pump", pump)
        assert sem.park(new_entry_id(), b"RLP1 x y\n1") == 1
        then()
        return found

    monkeypatch.setattr(ParkingQueue, "pump", pump_then_park)


def _app_with_pool(make_app: MakeApp, url: str) -> Any:
    app = make_app(
        redislock_url=url,
        redislock_prefix="dropped",
        redislock_client_options={"socket_timeout": 0.3},
    )

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call() -> None:  # pragma: no cover - never runs here
        pass

    return app


def test_a_run_parked_before_a_drop_whose_look_after_fails_is_not_forgotten(
    make_app: MakeApp, r: redis.Redis, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that found a pool empty dropped it from the set, then looked again for a
    run parked in between; when that look failed, the pool stayed out and that run
    (whose park had added the pool just before the drop) was forgotten: no sweeper or
    pump looked at the pool again until some later park found its queue empty."""
    app = _app_with_pool(make_app, fault_proxy.url)
    sem = ParkingSemaphore(r, "api", limit=1, ttl=30.0, prefix="dropped")
    assert sem.acquire(blocking=False) is not None  # held: the parked run stays parked
    pools = pools_key("dropped")
    r.sadd(pools, "api")  # a pool whose runs all started: found empty by the sweep
    # The look after the drop stalls (its script call times out): armed by the look
    # before the drop, the one that finds the queue empty.
    info = ParkingQueue.parking_info

    def look_then_stall(self: ParkingQueue, count: int = 0) -> ParkingInfo:
        found = info(self, count)
        monkeypatch.setattr(ParkingQueue, "parking_info", info)
        fault_proxy.hold(_INFO.sha.encode())
        return found

    _parked_after_the_pump(
        monkeypatch,
        sem,
        lambda: monkeypatch.setattr(ParkingQueue, "parking_info", look_then_stall),
    )
    try:
        with pytest.raises(redis.RedisError):
            sweep(app, set())
    finally:
        fault_proxy.release_held()
    assert r.sismember(pools, "api"), "the pool with a parked run was dropped from the set"
    assert sweep(app, set()) == (0, 1)  # and swept


def test_a_drop_that_fails_midway_is_undone_at_the_next_sweep(
    make_app: MakeApp, r: redis.Redis, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop itself stalls, and so does adding the pool back at once: the stalled
    drop lands later, when the sweep has given up. The sweep remembers the pool and
    adds it back at the next one."""
    app = _app_with_pool(make_app, fault_proxy.url)
    sem = ParkingSemaphore(r, "api", limit=1, ttl=30.0, prefix="dropped")
    assert sem.acquire(blocking=False) is not None
    pools = pools_key("dropped")
    r.sadd(pools, "api")
    _parked_after_the_pump(monkeypatch, sem, lambda: fault_proxy.hold(pools.encode()))
    unsure: set[tuple[str, str]] = set()  # as the Sweeper keeps it across sweeps
    try:
        with pytest.raises(redis.RedisError):
            sweep(app, unsure)
    finally:
        fault_proxy.release_held()  # the drop (and the add) land now, in either order
    assert sweep(app, unsure) == (0, 1)  # the pool is swept: its run is seen
    assert r.sismember(pools, "api") and not unsure
