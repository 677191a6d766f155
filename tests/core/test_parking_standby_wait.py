"""A standby waits in place *before* it takes its park token (so a run killed while it
waits leaves its entry claimed, to be published again): it is then both a claimed
entry without a permit and a waiter of the semaphore, and is counted once when
standbys are topped up."""

from __future__ import annotations

import threading
import time

import redis

from celery_redislock.core import Lease
from celery_redislock.core.parking import _TAKE, REFUSED, Parked, ParkingSemaphore, new_entry_id

from ..faults import FaultProxy


def test_a_standby_waiting_in_place_before_its_take_is_counted_once(r: redis.Redis) -> None:
    published: list[Parked] = []
    sem = ParkingSemaphore(
        r, "api", limit=1, ttl=5, standby=2, on_claimed=lambda _, claimed: published.extend(claimed)
    )
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


def test_a_standby_whose_take_fails_gives_back_the_permit_it_waited_for(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    """The permit a standby got by waiting in place is nobody's hold until its take
    answers: a take that raises (its replies lost) must not leave it renewed for the
    life of the pool process."""
    from celery import Celery

    from celery_redislock.celery.bounded.standby import take_parked

    app = Celery("standby-take", broker="memory://", set_as_current=False)
    sem = ParkingSemaphore(
        fault_proxy.client(socket_timeout=0.5),
        "api",
        limit=1,
        ttl=1,
        standby=1,
        on_claimed=lambda _, claimed: None,
    )
    held = sem.acquire(blocking=False)
    assert held is not None
    entry = new_entry_id()
    sem.park(entry, b"standby")  # claimed ahead as a standby, no permit reserved
    failed: list[BaseException] = []

    def run() -> None:
        try:
            take_parked(app, sem, entry, "t1", standby=1, wait=5, ttl=1, on_lost=lambda _: None)
        except Exception as exc:
            failed.append(exc)

    fault_proxy.drop_reply(_TAKE.sha.encode(), times=100)
    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 5
    while r.zcard(sem.keys.queue) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    held.release()  # hands the permit to the waiting standby; its take then fails
    runner.join(15)
    assert failed, "the take's replies were all lost: it raises"
    newcomer = ParkingSemaphore(r, "api", limit=1, ttl=1, standby=1)
    lease = newcomer.acquire(timeout=3)  # well past the 1 s lease unless it is renewed
    assert lease is not None, "the standby's permit was kept (renewed) with no run holding it"
    lease.release()
