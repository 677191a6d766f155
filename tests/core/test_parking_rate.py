"""A parking queue whose capacity is a rate limiter's admissions (RateCapacity, #25)."""

from __future__ import annotations

import time

import redis

from celery_redislock.core import RedisRateLimiter
from celery_redislock.core.parking import (
    DUPLICATE,
    HANDED_OVER,
    NOT_PARKED,
    TAKEN,
    Parked,
    ParkingQueue,
    RateCapacity,
    new_entry_id,
    parking_pools,
)


def _queue(r: redis.Redis, rate: str = "3/s") -> tuple[ParkingQueue, list[Parked]]:
    published: list[Parked] = []
    queue = ParkingQueue(
        RateCapacity(r, "api", rate=rate),
        reserve_ttl=5,
        on_claimed=lambda _, claimed: published.extend(claimed),
    )
    return queue, published


def test_parked_runs_are_claimed_in_order_as_the_rate_admits_them(r: redis.Redis) -> None:
    queue, published = _queue(r)
    ids = [new_entry_id() for _ in range(5)]
    positions = [
        queue.park(entry, f"run {i}".encode(), owner=f"t{i}") for i, entry in enumerate(ids)
    ]
    # The first three are admitted (charged) as they park; the rest wait in order.
    assert positions == [0, 0, 0, 1, 2]
    assert [e.id for e in published] == ids[:3]
    assert parking_pools(r, kind="rate") == ["api"]
    limiter = RedisRateLimiter(r, "api", rate="3/s")
    wait = limiter.retry_after()
    assert 0.5 < wait <= 1.01  # the window moves a period after the first admission
    assert queue.pump() == (2, [])  # nothing admitted before then
    time.sleep(wait + 0.05)
    parked, claimed = queue.pump()
    assert (parked, [e.id for e in claimed]) == (0, ids[3:])
    # Each claim was charged: of the second window's 3 admissions, one is left.
    assert limiter.acquire(blocking=False) and not limiter.acquire(blocking=False)


def test_a_claimed_run_takes_its_admission_once(r: redis.Redis) -> None:
    queue, _ = _queue(r)
    entry = new_entry_id()
    assert queue.park(entry, b"run", owner="t1") == 0
    assert queue.take(entry, "t1") == (TAKEN, None)
    assert queue.take(entry, "t1") == (TAKEN, None)  # a re-sent take (its reply lost)
    assert queue.take(entry, "other") == (DUPLICATE, None)  # a second message
    assert RedisRateLimiter(r, "api", rate="3/s").retry_after() == 0.0  # charged once


def test_intake_admits_a_free_run_or_parks_it_behind_the_others(r: redis.Redis) -> None:
    queue, published = _queue(r, "1/s")
    first, second = new_entry_id(), new_entry_id()
    assert queue.park(first, b"a", intake=True) == NOT_PARKED  # admitted: nothing changed
    assert queue.park(first, b"a", intake=True, hand_over=True) == HANDED_OVER
    assert queue.take(first, "t1") == (TAKEN, None)
    assert queue.park(second, b"b", intake=True, hand_over=True) == 1  # over the rate
    assert published == []
    assert queue.parking_info().parked == 1


def test_a_penalty_holds_parked_runs_back_for_every_process(r: redis.Redis) -> None:
    queue, _ = _queue(r, "100/s")
    RedisRateLimiter(r, "api", rate="100/s").penalize(0.5)
    entry = new_entry_id()
    assert queue.park(entry, b"a") == 1
    assert queue.pump() == (1, [])
    time.sleep(0.6)
    assert [e.id for e in queue.pump()[1]] == [entry]


def test_a_dropped_claim_is_refunded_and_its_id_consumed(r: redis.Redis) -> None:
    """A claimed run that parks elsewhere (refused a concurrency permit) leaves the
    queue: its charge is refunded -- it is charged when it really starts -- and a
    later message of it is a duplicate (#25). A parked entry dropped never runs."""
    queue, published = _queue(r, rate="2/10s")
    claimed, parked = new_entry_id(), new_entry_id()
    assert queue.park(claimed, b"run", owner="t1") == 0
    assert queue.park(new_entry_id(), b"other", owner="t2") == 0
    assert queue.park(parked, b"later", owner="t3") == 1
    limiter = RedisRateLimiter(r, "api", rate="2/10s")
    assert [u.used for u in limiter.info().active] == [2]
    assert queue.drop(claimed) and not queue.drop(claimed)  # a re-sent drop: consumed
    assert [u.used for u in limiter.info().active] == [1]  # refunded
    assert queue.take(claimed, "t1") == (DUPLICATE, None)
    assert queue.drop(parked)
    assert (queue.parking_info().parked, queue.parking_info().claimed) == (0, 1)  # t2
    assert queue.pump() == (0, []) and [e.owner for e in published] == ["t1", "t2"]
    assert limiter.acquire(blocking=False) and not limiter.acquire(blocking=False)


def test_a_pump_answers_when_the_head_is_admitted(r: redis.Redis) -> None:
    """The pump's one script call answers the next admission with its claims (the
    workers' pumps sleep until then without a retry_after call, #25)."""
    queue, _ = _queue(r, rate="2/2s")
    for i in range(3):
        queue.park(new_entry_id(), f"run {i}".encode(), owner=f"t{i}")
    parked, claimed, wait = queue.pump_until()
    assert (parked, claimed) == (1, [])
    assert wait is not None and 1.9 < wait <= 2.01
    limiter = RedisRateLimiter(r, "api", rate="2/2s")
    assert abs(limiter.retry_after() - wait) < 0.05
    limiter.penalize(5)
    assert 4.9 < (queue.pump_until()[2] or 0) <= 5.0  # a penalty counts
    limiter.reset()
    parked, claimed, wait = queue.pump_until()
    assert (parked, len(claimed), wait) == (0, 1, None)  # none left parked
