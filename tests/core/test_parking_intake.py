"""ParkingSemaphore.park in intake mode, parking by sending time, and stamped replies."""

from __future__ import annotations

import time

import pytest
import redis

from celery_redislock.core import parking
from celery_redislock.core.parking import NOT_PARKED, ParkingSemaphore, new_entry_id
from celery_redislock.core.scripts import StaleReply

from .test_parking import _pool


def test_intake_parks_only_a_run_that_would_be_refused(r: redis.Redis) -> None:
    sem, published = _pool(r, limit=2)
    assert sem.park(new_entry_id(), b"a", intake=True) == NOT_PARKED  # a permit is free
    assert sem.parking_info().parked == 0  # nothing changed
    leases = [sem.acquire(blocking=False), sem.acquire(blocking=False)]
    assert all(leases)
    first = new_entry_id()
    assert sem.park(first, b"b", "t1", intake=True) == 1  # none free: parked
    assert sem.park(first, b"b", "t1", intake=True) == 1  # a re-sent park answers alike
    leases[0].release()  # type: ignore[union-attr]
    assert published.payloads() == [b"b"]
    published.entries.clear()
    # A permit is free only for a moment while runs are parked: a fresh run goes
    # behind them (FIFO), and the head is claimed for the free permit.
    sem.park(new_entry_id(), b"c", intake=True)
    r.zrem(sem.keys.holders, first)  # its reservation ends: a permit is free
    assert sem.park(new_entry_id(), b"d", intake=True) == 1
    assert published.payloads() == [b"c"]


def test_a_run_parks_at_its_place_by_sending_time(r: redis.Redis) -> None:
    sem, published = _pool(r, limit=1)
    lease = sem.acquire(blocking=False)
    now = time.time()
    sem.park(new_entry_id(), b"late", sent=now - 1)
    sem.park(new_entry_id(), b"early", sent=now - 2)
    sem.park(new_entry_id(), b"unstamped")
    sem.park(new_entry_id(), b"skewed", sent=now - 3600)  # clamped: a minute ahead at most
    sem.park(new_entry_id(), b"future", sent=now + 3600)  # clamped: now
    assert [row[2] for row in sem.parking_info(count=9).head] == ["", "", "", "", ""]
    order = []
    for _ in range(5):
        assert lease is not None and lease.release()
        order.extend(published.payloads())
        published.entries.clear()
        _status, lease = sem.take(r.zrange(sem.claimed_key, 0, 0)[0].decode(), "o")
    assert order == [b"skewed", b"early", b"late", b"unstamped", b"future"]


@pytest.mark.parametrize("script", ["_PARK", "_RELEASE", "_TAKE", "_RETURN"])
def test_parking_replies_are_stamped(script: str) -> None:
    lua = getattr(parking, script)
    assert lua.code, f"{lua.name} answers without a stamp"
    with pytest.raises(StaleReply):
        lua.checked(1, ["0123456789"])  # another command's bare reply is never taken
    assert lua.checked([f"{lua.code}01234567".encode(), [1]], ["0123456789"]) == [1]


def test_standby_claims_expire_with_the_payloads(r: redis.Redis) -> None:
    sem = ParkingSemaphore(r, "api", limit=1, ttl=5, standby=1, on_claimed=lambda s, c: None)
    lease = sem.acquire(blocking=False)
    assert lease is not None
    sem.park(new_entry_id(), b"a")  # claimed at once as a standby, no permit
    assert r.zcard(sem.claimed_key) == 1 and r.pttl(sem.claimed_key) > 0


def test_a_pump_reserves_for_the_parked_tasks_term_not_its_own(r: redis.Redis) -> None:
    sem, _ = _pool(r, limit=1, reserve_ttl=5)
    lease = sem.acquire(blocking=False)
    assert lease is not None
    sem.park(new_entry_id(), b"a")
    r.zrem(sem.keys.holders, lease.token)  # the permit comes back outside a release
    sweeper = ParkingSemaphore(r, "api", limit=1, ttl=300, on_claimed=lambda s, c: None)
    assert len(sweeper.pump()[1]) == 1
    ((_, expiry),) = r.zrange(sem.claimed_key, 0, -1, withscores=True)
    now = r.time()
    assert expiry - (now[0] * 1000 + now[1] // 1000) <= 5000  # not 300 s
