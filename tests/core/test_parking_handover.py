"""ParkingSemaphore.park(intake=True, hand_over=True): a free permit is reserved for the
parking run itself (kept, not published), so runs take permits in intake order."""

from __future__ import annotations

import time

import redis

from celery_redislock.core.parking import (
    DUPLICATE,
    HANDED_OVER,
    TAKEN,
    new_entry_id,
    parking_pools,
)

from .test_parking import _pool


def test_a_free_permit_is_reserved_for_the_run_not_published(r: redis.Redis) -> None:
    sem, published = _pool(r, limit=1)
    entry = new_entry_id()
    assert sem.park(entry, b"a", "t0", intake=True, hand_over=True) == HANDED_OVER
    assert published.payloads() == []  # the caller's own run starts: nothing to publish
    assert parking_pools(r) == ["api"]  # a sweeper finds it if the run never takes it
    assert sem.parking_info().claimed == 1
    assert sem.acquire(blocking=False) is None  # reserved: a newcomer is refused
    second = new_entry_id()
    assert sem.park(second, b"b", "t1", intake=True, hand_over=True) == 1  # none free
    status, lease = sem.take(entry, owner="t0@x")
    assert status == TAKEN and lease is not None
    assert sem.take(entry) == (DUPLICATE, None)  # its message never runs twice
    assert lease.release()
    assert published.payloads() == [b"b"]  # the next one is published as usual


def test_a_run_handed_over_goes_behind_runs_parked_before_it(r: redis.Redis) -> None:
    sem, published = _pool(r, limit=1)
    lease = sem.acquire(blocking=False)
    assert lease is not None
    sem.park(new_entry_id(), b"first", intake=True, hand_over=True)
    r.zrem(sem.keys.holders, lease.token)  # the permit comes back outside a release
    assert sem.park(new_entry_id(), b"second", intake=True, hand_over=True) == 1
    assert published.payloads() == [b"first"]  # the head got the free permit (FIFO)


def test_a_hand_over_never_taken_is_published_when_its_reservation_lapses(
    r: redis.Redis,
) -> None:
    sem, published = _pool(r, limit=1, reserve_ttl=0.05)
    entry = new_entry_id()
    assert sem.park(entry, b"a", intake=True, hand_over=True) == HANDED_OVER
    time.sleep(0.1)  # its run died before before_start: the sweeper's pump
    assert sem.pump()[1] and published.payloads() == [b"a"]
    status, lease = sem.take(entry, owner="t0@y")  # the published copy runs, once
    assert status == TAKEN and lease is not None and lease.release()


def test_a_re_sent_hand_over_answers_alike(r: redis.Redis) -> None:
    sem, published = _pool(r, limit=1)
    entry = new_entry_id()
    assert sem.park(entry, b"a", intake=True, hand_over=True) == HANDED_OVER
    assert sem.park(entry, b"a", intake=True, hand_over=True) == HANDED_OVER  # reply lost
    assert published.payloads() == [] and sem.parking_info().claimed == 1
