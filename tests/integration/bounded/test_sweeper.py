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
from celery_redislock.core.parking import Parked, ParkingSemaphore, new_entry_id, pools_key

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
