"""A parking queue of a rate limiter's admissions on a real Redis Cluster (#25): the
queue's keys share the limiter's hash tag, so every parking script runs on the primary
serving that slot."""

from __future__ import annotations

from redis.cluster import RedisCluster

from celery_redislock import RedisRateLimiter
from celery_redislock.core.parking import (
    DUPLICATE,
    TAKEN,
    Parked,
    ParkingQueue,
    RateCapacity,
    new_entry_id,
)


def test_rate_parking_paths(rc: RedisCluster, name: str) -> None:
    claimed: list[Parked] = []
    queue = ParkingQueue(
        RateCapacity(rc, name, rate="2/m"),
        reserve_ttl=5,
        on_claimed=lambda _, entries: claimed.extend(entries),
    )
    ids = [new_entry_id() for _ in range(3)]
    assert [
        queue.park(entry, f"run {i}".encode(), owner=f"t{i}") for i, entry in enumerate(ids)
    ] == [0, 0, 1]
    assert [entry.id for entry in claimed] == ids[:2]  # admitted (charged) as they parked
    assert queue.take(ids[0], "t0") == (TAKEN, None)
    assert queue.take(ids[0], "t0") == (TAKEN, None)  # re-sent
    assert queue.take(ids[0], "other")[0] == DUPLICATE
    assert queue.give_back(ids[1])  # could not publish: back to its place, refunded
    assert queue.pump()[1][0].id == ids[1]
    assert queue.pump() == (1, [])  # the third waits a minute
    assert RedisRateLimiter(rc, name, rate="2/m").retry_after() > 30
    assert queue.parking_info().parked == 1
