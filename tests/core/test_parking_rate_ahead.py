"""A rate limiter's parking queue claiming runs ahead of their admission time
(RateCapacity ``ahead``, #25): runs on their way through a broker start on time, not
one transit late per period, and the limit still holds on their starts."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock.core import RedisRateLimiter
from celery_redislock.core.parking import (
    REFUSED,
    TAKEN,
    Parked,
    ParkingQueue,
    RateCapacity,
    new_entry_id,
)
from celery_redislock.errors import ConfigurationError

pytestmark = pytest.mark.serial  # asserts on start times

TRANSIT = 0.025  # seconds from a claim to its run's take: a broker's way, simulated
AHEAD = 0.035


def _most_in(starts: list[float], period: float) -> int:
    starts, most, low = sorted(starts), 0, 0
    for high, at in enumerate(starts):
        while at - starts[low] >= period:
            low += 1
        most = max(most, high - low + 1)
    return most


def _backlog(r: redis.Redis, ahead: float, periods: int = 4, limit: int = 5) -> list[float]:
    """Park ``periods * limit`` runs at ``limit``/s and pump as a worker's pump does;
    each claimed run takes its entry ``TRANSIT`` later and records its start."""
    starts: list[float] = []
    outcomes: list[str] = []
    guard = threading.Lock()
    threads: list[threading.Thread] = []

    def run(queue: ParkingQueue, entry: Parked) -> None:
        time.sleep(TRANSIT)
        status, _ = queue.take(entry.id, entry.owner)
        with guard:
            outcomes.append(status)
            if status == TAKEN:
                starts.append(time.time())

    def claimed(queue: ParkingQueue, entries: list[Parked]) -> None:
        for entry in entries:
            thread = threading.Thread(target=run, args=(queue, entry))
            threads.append(thread)
            thread.start()

    rate = f"{limit}/s"
    capacity = RateCapacity(r, "api", rate=rate, ahead=ahead)
    queue = ParkingQueue(capacity, reserve_ttl=10, on_claimed=claimed)
    limiter = RedisRateLimiter(r, "api", rate=rate)
    for i in range(periods * limit):
        queue.park(new_entry_id(), b"run", owner=f"t{i}")
    deadline = time.monotonic() + periods + 10
    while time.monotonic() < deadline:
        parked, _ = queue.pump()
        if not parked:
            break
        time.sleep(max(limiter.retry_after() - ahead, 0.001))
    for thread in list(threads):
        thread.join(10)
    assert REFUSED not in outcomes and len(starts) == periods * limit
    return sorted(starts)


def test_runs_claimed_ahead_start_on_time_and_the_limit_holds(r: redis.Redis) -> None:
    starts = _backlog(r, AHEAD)
    assert _most_in(starts, 1.0) <= 5  # the limit, on the starts
    # Each period's first start follows the last one's by about a period: drift of
    # START_MARGIN_US (10 ms) and wake-ups, not the 25 ms transit on top (claimed at
    # the admission time and charged at the start: ~35-45 ms per period).
    drift = (starts[15] - starts[0] - 3.0) / 3
    assert drift < 0.025, drift


def test_runs_claimed_at_their_admission_time_drift_by_the_transit(r: redis.Redis) -> None:
    """The reference: without ``ahead`` each period starts a transit late."""
    starts = _backlog(r, 0.0)
    assert _most_in(starts, 1.0) <= 5
    assert (starts[15] - starts[0] - 3.0) / 3 > TRANSIT


@pytest.mark.parametrize("ahead", [-0.1, 2.0, "0.1", True])
def test_a_bad_ahead_is_refused(r: redis.Redis, ahead: object) -> None:
    with pytest.raises(ConfigurationError, match="ahead"):
        RateCapacity(r, "api", rate="5/s", ahead=ahead)  # type: ignore[arg-type]
