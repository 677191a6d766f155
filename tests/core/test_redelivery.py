"""redelivered_take.lua (core/redelivery.py): another message of a consumed park token
is told, from the first run's permit on a real redis-server, whether that run lives,
ended, or died (#24)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock.core.parking import (
    DUPLICATE,
    REFUSED,
    TAKEN,
    ParkingSemaphore,
    new_entry_id,
)
from celery_redislock.core.redelivery import (
    ALIVE,
    DEAD_REFUSED,
    ENDED,
    NOT_TAKEN,
    RETAKEN,
    mark_ran,
    mark_token,
    retake,
)

from ..faults import FaultProxy


def _taken(r: redis.Redis, ttl: float = 0.3) -> tuple[ParkingSemaphore, str]:
    """A pool of limit 1 whose only permit is the run of a consumed entry (``ttl``)."""
    sem = ParkingSemaphore(r, "api", limit=1, ttl=ttl)
    entry_id = new_entry_id()
    assert sem.park(entry_id, b"run", owner="t1") == 0  # claimed at once: a permit free
    status, lease = sem.take(entry_id, "t1@first", ttl=ttl)
    assert status == TAKEN and lease is not None
    assert sem.take(entry_id, "t1@copy")[0] == DUPLICATE
    return sem, entry_id


def test_a_never_consumed_id_is_left_to_take(r: redis.Redis) -> None:
    sem = ParkingSemaphore(r, "api", limit=1, ttl=1)
    assert retake(sem, new_entry_id(), "o", ttl=1, memory=60)[0] == NOT_TAKEN


def test_a_live_first_run_is_alive_with_its_time_left(r: redis.Redis) -> None:
    sem, entry_id = _taken(r, ttl=5)
    status, lease, left = retake(sem, entry_id, "t1@copy", ttl=5, memory=60)
    assert (status, lease) == (ALIVE, None) and 4.0 < left <= 5.0


def test_an_ended_run_is_never_run_again(r: redis.Redis) -> None:
    sem, entry_id = _taken(r, ttl=0.3)
    mark_ran(sem, entry_id, 60)
    time.sleep(0.4)  # its permit lapsed too: the mark decides
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == ENDED


def test_a_dead_run_is_run_by_the_copy_once_on_a_permit_under_the_id(r: redis.Redis) -> None:
    sem, entry_id = _taken(r, ttl=0.3)
    time.sleep(0.4)  # the first run's permit lapsed unrenewed: its worker died
    status, lease, _ = retake(sem, entry_id, "t1@copy", ttl=2, memory=60, renew=False)
    assert status == RETAKEN and lease is not None and lease.token == entry_id
    assert sem.acquire(blocking=False) is None  # the limit holds: the copy has the permit
    # A re-sent call (reply lost) gets the same permit; a third message sees it alive.
    again = retake(sem, entry_id, "t1@copy", ttl=2, memory=60, renew=False)
    assert again[0] == RETAKEN and again[1] is not None and again[1].fence == lease.fence
    assert retake(sem, entry_id, "t1@third", ttl=2, memory=60)[0] == ALIVE
    assert lease.release()


def test_a_dead_run_with_no_permit_free_parks_again_and_is_marked(r: redis.Redis) -> None:
    sem, entry_id = _taken(r, ttl=0.3)
    time.sleep(0.4)
    other = sem.acquire(blocking=False, ttl=5)  # the permit went to another run
    assert other is not None
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == DEAD_REFUSED
    # The copy parks again under a new id: a further message of the old one is dropped.
    assert retake(sem, entry_id, "t1@third", ttl=1, memory=60)[0] == ENDED
    other.release()


def test_a_standbys_run_is_alive_by_the_permit_it_named(r: redis.Redis) -> None:
    sem, entry_id = _taken(r, ttl=0.3)
    time.sleep(0.4)  # the entry's own permit is gone ...
    early = ParkingSemaphore(r, "api", limit=1, ttl=5).acquire(blocking=False)
    assert early is not None
    mark_token(sem, entry_id, early.token, 60)  # ... but its run holds this one
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == ALIVE
    early.release()


def test_a_run_refused_at_its_take_parks_again_and_the_ids_other_message_never_runs(
    r: redis.Redis,
) -> None:
    # A parked run's message came late (its reservation lapsed: the #29 backlog); its
    # take consumes the id but is refused (the permit went to another run), and the
    # guard parks it again under a new id. Another message of the old id (the one the
    # sweeper published again) must not run once a permit is free: the run is parked.
    sem = ParkingSemaphore(r, "api", limit=1, ttl=0.3)
    entry_id = new_entry_id()
    assert sem.park(entry_id, b"run", owner="t1") == 0  # claimed at once, reserved
    time.sleep(0.4)  # the reservation lapsed before the message was read
    other = sem.acquire(blocking=False, ttl=5)
    assert other is not None
    assert sem.take(entry_id, "t1@late", ttl=1) == (REFUSED, None)  # parks again
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == ENDED
    assert other.release()  # a permit is free now: still not this copy's
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == ENDED
    assert sem.acquire(blocking=False) is not None  # the free permit was left alone


def test_a_standby_handed_its_reservation_too_runs_on_the_entrys_permit(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A standby waited in place while its entry was published again with a reservation:
    # it holds two permits at its take and keeps one. A copy arriving right then must
    # see the run alive -- never find the permit just given back free and run beside it.
    from celery import Celery

    from celery_redislock.celery.bounded import standby

    app = Celery("standby-copy", broker="memory://", set_as_current=False)
    sem = ParkingSemaphore(r, "api", limit=2, ttl=5)
    entry_id = new_entry_id()
    assert sem.park(entry_id, b"run", owner="t1") == 0  # claimed, a permit reserved
    monkeypatch.setattr(standby, "_is_standby", lambda *_: True)  # it waited first
    slow = threading.Event()  # the run's note of its permit, not written yet
    real_mark = standby.mark_token
    monkeypatch.setattr(standby, "mark_token", lambda *a: (slow.wait(5), real_mark(*a)))
    status, lease = standby.take_parked(
        app, sem, entry_id, "t1@first", standby=1, wait=1, ttl=5, on_lost=lambda _: None
    )
    try:
        assert status == TAKEN and lease is not None
        assert retake(sem, entry_id, "t1@copy", ttl=5, memory=60)[0] == ALIVE
        assert len(sem.info().holders) == 1  # one run, one permit
    finally:
        slow.set()
        lease.release()


def test_a_dead_runs_copy_told_to_park_again_is_told_so_again_when_the_reply_is_lost(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    # No permit free: the copy must park again (the old id is marked). Its reply lost,
    # redis-py sends the call again: the answer must be the same, not "ended" (the
    # copy would be dropped and the run lost).
    from celery_redislock.core.redelivery import _RETAKE

    _, entry_id = _taken(r, ttl=0.3)
    time.sleep(0.4)
    other = ParkingSemaphore(r, "api", limit=1, ttl=5).acquire(blocking=False)
    assert other is not None
    sem = ParkingSemaphore(fault_proxy.client(), "api", limit=1, ttl=0.3)
    r.script_load(_RETAKE.text)  # EVALSHA runs it (a NOSCRIPT reply is not the case)
    fault_proxy.drop_reply(_RETAKE.sha.encode())
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == DEAD_REFUSED
    assert fault_proxy.dropped == 1  # it ran twice
    assert retake(sem, entry_id, "t1@third", ttl=1, memory=60)[0] == ENDED  # another's
    other.release()


def test_a_standbys_run_that_ended_before_it_named_its_permit_stays_ended(
    r: redis.Redis,
) -> None:
    # A standby's run names its permit off the run's path (a thread): a short body can
    # end (and mark its entry as run) first. The late name must not undo that mark, or
    # a later message of the entry finds the named permit released and runs again.
    sem, entry_id = _taken(r, ttl=0.3)
    early = ParkingSemaphore(r, "api", limit=2, ttl=5).acquire(blocking=False)
    assert early is not None
    mark_ran(sem, entry_id, 60)  # the run ended ...
    assert early.release()
    mark_token(sem, entry_id, early.token, 60)  # ... before its thread named the permit
    time.sleep(0.4)
    assert retake(sem, entry_id, "t1@copy", ttl=1, memory=60)[0] == ENDED
