"""A standby waits in place *before* it takes its park token (so a run killed while it
waits leaves its entry claimed, to be published again): it is then both a claimed
entry without a permit and a waiter of the semaphore, and is counted once when
standbys are topped up."""

from __future__ import annotations

import threading
import time

import redis

from celery_redislock.core import Lease
from celery_redislock.core.parking import REFUSED, Parked, ParkingSemaphore, new_entry_id


def test_a_standby_waiting_in_place_before_its_take_is_counted_once(r: redis.Redis) -> None:
    published: list[Parked] = []
    sem = ParkingSemaphore(r, "api", limit=1, ttl=5, standby=2,
                           on_claimed=lambda _, claimed: published.extend(claimed))  # fmt: skip
    held = sem.acquire(blocking=False)
    assert held is not None
    first, second = new_entry_id(), new_entry_id()
    sem.park(first, b"first")
    assert [e.payload for e in published] == [b"first"]  # claimed ahead, no permit
    got: list[Lease | None] = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=5, owner="t1")))
    waiter.start()  # the first standby's run waits in place; its entry is still claimed
    deadline = time.monotonic() + 5
    while r.zcard(sem.keys.queue) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        sem.park(second, b"second")  # one standby ahead, not two: the second is claimed too
        assert [e.payload for e in published] == [b"first", b"second"]
    finally:
        held.release()  # hands the permit to the waiting standby
        waiter.join(5)
    lease = got[0]
    assert lease is not None
    # Its token, taken with the permit it has: consumed, no second permit.
    assert sem.take(first, owner="t1") == (REFUSED, None)
    assert sem.parking_info().claimed == 1  # the second, on its way
    lease.release()
