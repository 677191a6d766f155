"""The rate pump of a worker's main process: one pool it cannot pump (a corrupted
``rates`` field, a limiter written by another version) is skipped and logged once,
not every round; the pools after it are pumped all the same."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis

from celery_redislock import RedisRateLimiter
from celery_redislock.celery.ratelimit.pump import pump_once
from celery_redislock.celery.ratelimit.queues import rate_queue
from celery_redislock.core.parking import new_entry_id
from celery_redislock.core.ratelimit_scripts import state_key

from ..conftest import MakeApp


def test_a_pool_that_cannot_be_pumped_does_not_starve_the_pools_after_it(
    make_app: MakeApp, locks: redis.Redis, caplog: Any
) -> None:
    """Pools come back from Redis sorted, so a bad one ended every round before the
    ones after it: ``pump_once`` raised (ValueError of the rates' parse) and no later
    rate-limited pool of any worker was pumped again."""
    app = make_app(redislock_prefix="pumped")
    bad, good = rate_queue(app, "a-bad", ("1/s",)), rate_queue(app, "b-good", ("1/s",))
    for pool, queue in (("a-bad", bad), ("b-good", good)):
        # The limiter's one admission of this second is taken: the run is parked.
        assert RedisRateLimiter(locks, pool, rate="1/s", prefix="pumped").acquire(blocking=False)
        queue.park(new_entry_id(), b"RLP1 x y\n1")
        assert queue.parking_info().parked == 1
    state = state_key(locks, "a-bad", "pumped")
    assert locks.hget(state, "rates")  # parking stored the rates with the limiter
    locks.hset(state, "rates", "not-a-rate")
    caplog.set_level(logging.DEBUG, logger="celery_redislock")
    skipped: dict[str, str] = {}  # as the pump's thread keeps it across rounds
    deadline, rounds = time.monotonic() + 3.0, 0
    while good.parking_info().parked and time.monotonic() < deadline:
        time.sleep(pump_once(app, skipped))  # as the pump's thread does, until the admission
        rounds += 1
    assert rounds >= 3  # the bad pool was met in every round, said once
    info = good.parking_info()
    assert info.parked == 0, info  # pumped (its undecodable entry is dead-lettered)
    assert bad.parking_info().parked == 1  # skipped, still parked
    warned = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "a-bad" in r.getMessage()
    ]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "ValueError" in warned[0].getMessage()
    assert list(skipped) == ["a-bad"]


def test_an_unreachable_redis_still_ends_the_round(make_app: MakeApp) -> None:
    app = make_app(redislock_url="redis://127.0.0.1:1/0")
    with pytest.raises(redis.ConnectionError):
        pump_once(app)
