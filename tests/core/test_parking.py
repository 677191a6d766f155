"""ParkingSemaphore: the parking scripts' contract on a real redis-server."""

from __future__ import annotations

import time

import pytest
import redis

from celery_redislock.core.parking import (
    DUPLICATE,
    REFUSED,
    TAKEN,
    Parked,
    ParkingSemaphore,
    new_entry_id,
    parking_pools,
)


class Published:
    """An ``on_claimed`` that records what it was asked to publish."""

    def __init__(self) -> None:
        self.entries: list[Parked] = []

    def __call__(self, sem: ParkingSemaphore, claimed: list[Parked]) -> None:
        self.entries.extend(claimed)

    def payloads(self) -> list[bytes]:
        return [entry.payload for entry in self.entries]


def _listening(r: redis.Redis, sem: ParkingSemaphore) -> bool:
    """True once the first queued waiter's process listens on its wake-up channel."""
    head = r.zrange(sem.keys.queue, 0, 0)
    if not head:
        return False
    channel = f"{sem.keys.channel}:{head[0].decode().rsplit('.', 1)[1]}"
    return bool(r.pubsub_numsub(channel)[0][1])


def _pool(r: redis.Redis, limit: int = 1, **kwargs: float) -> tuple[ParkingSemaphore, Published]:
    published = Published()
    return ParkingSemaphore(r, "api", limit=limit, ttl=5, on_claimed=published, **kwargs), published  # type: ignore[arg-type]


def test_release_hands_the_permit_to_the_oldest_parked_run(r: redis.Redis) -> None:
    sem, published = _pool(r)
    held = sem.acquire(blocking=False)
    assert held is not None and sem.acquire(blocking=False) is None
    ids = [new_entry_id() for _ in range(3)]
    assert [sem.park(i, b"run %d" % n, owner=f"t{n}") for n, i in enumerate(ids)] == [1, 2, 3]
    assert parking_pools(r) == ["api"]
    info = sem.parking_info(count=5)
    assert (info.parked, info.claimed, info.dead) == (3, 0, 0)
    assert [row[2] for row in info.head] == ["t0", "t1", "t2"]
    assert info.oldest_age is not None and info.oldest_age >= 0
    assert held.release()
    assert published.payloads() == [b"run 0"]  # the release claimed the head
    # Its permit is reserved: a newcomer is refused, the queue keeps its order.
    assert sem.acquire(blocking=False) is None
    assert sem.parking_info().claimed == 1 and sem.parking_info().parked == 2
    status, lease = sem.take(ids[0], owner="t0@x")
    assert status == TAKEN and lease is not None and lease.token == ids[0]
    assert sem.parking_info().claimed == 0
    assert sem.take(ids[0]) == (DUPLICATE, None)  # a second message never runs
    assert lease.release()
    assert published.payloads() == [b"run 0", b"run 1"]
    assert not r.hexists(sem.payloads_key, f"p:{ids[0]}")  # deleted once taken


def test_every_free_permit_goes_to_the_queue_and_a_lowered_limit_is_obeyed(
    r: redis.Redis,
) -> None:
    sem, published = _pool(r, limit=3)
    leases = [sem.acquire(blocking=False) for _ in range(3)]
    ids = [new_entry_id() for _ in range(4)]
    for n, i in enumerate(ids):
        sem.park(i, b"%d" % n)
    lowered = ParkingSemaphore(r, "api", limit=1, ttl=5, on_claimed=published)
    assert lowered.acquire(blocking=False) is None  # stores limit 1
    for lease in leases:
        assert lease is not None and lease.release()
    # Three permits came back, but the pool's limit is 1 now: one claim only.
    assert published.payloads() == [b"0"]
    status, run = lowered.take(ids[0])
    assert status == TAKEN and run is not None
    assert lowered.pump() == (3, [])  # nothing free while the run holds the one permit
    run.release()
    assert published.payloads() == [b"0", b"1"]


def test_a_lapsed_reservation_goes_back_to_its_place_and_the_next_claim(r: redis.Redis) -> None:
    sem, published = _pool(r, reserve_ttl=0.1)
    held = sem.acquire(blocking=False)
    first, second = new_entry_id(), new_entry_id()
    sem.park(first, b"first")
    sem.park(second, b"second")
    assert held is not None and held.release()
    assert published.payloads() == [b"first"]
    time.sleep(0.15)  # its run never started (message lost, publisher died)
    parked, claimed = sem.pump()
    # Back at its old place (ahead of `second`), claimed again, published again.
    assert (parked, [c.payload for c in claimed]) == (1, [b"first"])
    status, lease = sem.take(first)
    assert status == TAKEN and lease is not None
    assert sem.take(first)[0] == DUPLICATE


def test_a_late_run_takes_a_free_permit_or_parks_again(r: redis.Redis) -> None:
    sem, published = _pool(r, reserve_ttl=0.05)
    entry = new_entry_id()
    sem.park(entry, b"x")  # claimed at once: the permit was free
    assert published.payloads() == [b"x"]
    time.sleep(0.1)
    other = sem.acquire(blocking=False)  # the lapsed reservation's permit is taken
    assert other is not None
    assert sem.take(entry) == (REFUSED, None)  # consumed; the caller parks it again
    assert sem.take(entry)[0] == DUPLICATE
    other.release()
    unknown = new_entry_id()  # e.g. Redis lost the entry: run it if a permit is free
    status, lease = sem.take(unknown)
    assert status == TAKEN and lease is not None


def test_give_back_to_the_queue_or_to_the_dead_letters(r: redis.Redis) -> None:
    sem, published = _pool(r)
    held = sem.acquire(blocking=False)
    bad, good = new_entry_id(), new_entry_id()
    sem.park(bad, b"\xff not a message")
    sem.park(good, b"ok")
    assert held is not None and held.release()
    assert published.entries[-1].id == bad
    assert sem.give_back(bad, dead="cannot decode: bad header")
    # No longer claimed: a no-op, answered as the first call (a re-send after a lost reply).
    assert sem.give_back(bad, dead="again")
    ((dead_id, at, reason, payload),) = sem.dead_letters()
    assert (dead_id, reason, payload) == (bad, "cannot decode: bad header", b"\xff not a message")
    assert abs(at - time.time()) < 5
    assert sem.parking_info().dead == 1
    sem.pump()  # the freed permit goes on: the queue is never blocked
    assert published.entries[-1].id == good
    assert sem.give_back(good)  # the broker refused it: back to the queue
    assert sem.parking_info().parked == 1
    assert sem.pump()[1][0].id == good


def test_release_owner_hands_the_permit_on(r: redis.Redis) -> None:
    sem, published = _pool(r)
    assert sem.acquire(blocking=False, owner="dead-child") is not None
    sem.park(new_entry_id(), b"next")
    assert sem.release_owner("dead-child") == 1
    assert published.payloads() == [b"next"]


def test_a_resent_park_changes_nothing(r: redis.Redis) -> None:
    sem, _ = _pool(r)
    assert sem.acquire(blocking=False) is not None
    entry = new_entry_id()
    assert sem.park(entry, b"a") == 1
    assert sem.park(entry, b"a") == 1  # the same answer as the first
    assert sem.parking_info().parked == 1


def test_park_checks_its_payload(r: redis.Redis) -> None:
    sem, _ = _pool(r)
    with pytest.raises(ValueError, match="payload must be bytes"):
        sem.park(new_entry_id(), "text")  # type: ignore[arg-type]


def test_resent_park_and_take_answer_as_the_first(r: redis.Redis) -> None:
    sem, published = _pool(r)
    entry = new_entry_id()
    assert sem.park(entry, b"x") == 0  # claimed at once: the permit was free
    status, lease = sem.take(entry, owner="task@1")
    assert status == TAKEN and lease is not None
    again, second = sem.take(entry, owner="task@1")  # its reply was lost: same lease
    assert again == TAKEN and second is not None and second.fence == lease.fence
    assert sem.take(entry, owner="task@2")[0] == DUPLICATE  # another delivery
    assert sem.park(entry, b"x") == 0  # a park re-sent after its run took it
    assert sem.parking_info().parked == 0 and len(published.entries) == 1


def test_a_resent_refused_take_is_refused_again(r: redis.Redis) -> None:
    sem, _ = _pool(r, reserve_ttl=0.05)
    entry = new_entry_id()
    sem.park(entry, b"x")
    time.sleep(0.1)
    assert sem.acquire(blocking=False) is not None  # the lapsed reservation's permit
    assert sem.take(entry, owner="task@1") == (REFUSED, None)
    assert sem.take(entry, owner="task@1") == (REFUSED, None)  # not a duplicate
    assert sem.take(entry, owner="task@2")[0] == DUPLICATE


def test_a_run_waiting_in_place_is_served_before_the_parked_queue(r: redis.Redis) -> None:
    import threading

    sem, published = _pool(r)
    held = sem.acquire(blocking=False)
    assert held is not None
    sem.park(new_entry_id(), b"parked")
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=5)))
    waiter.start()
    deadline = time.monotonic() + 5
    while not _listening(r, sem) and time.monotonic() < deadline:  # as below: not only queued
        time.sleep(0.01)
    assert held.release()
    waiter.join(5)
    assert got and got[0] is not None  # handed the permit in the release
    assert published.entries == []  # nothing free for the parked run yet
    got[0].release()  # type: ignore[attr-defined]
    assert published.payloads() == [b"parked"]


def test_standbys_are_claimed_ahead_without_a_permit(r: redis.Redis) -> None:
    published = Published()
    sem = ParkingSemaphore(r, "api", limit=1, ttl=5, on_claimed=published, standby=1)
    held = sem.acquire(blocking=False)
    assert held is not None
    first, second = new_entry_id(), new_entry_id()
    sem.park(first, b"first")
    assert published.payloads() == [b"first"]  # claimed ahead at once, no permit
    sem.park(second, b"second")
    assert published.payloads() == [b"first"]  # one standby is enough
    assert len(sem.info().holders) == 1  # nothing reserved: the permit is still held
    assert sem.take(first, owner="t1") == (REFUSED, None)  # its run waits in place
    got: list[object] = []
    import threading

    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=5, owner="t1")))
    waiter.start()
    deadline = time.monotonic() + 5
    # Listening, not only queued: a blocking semaphore acquire queues with its first
    # attempt, before it subscribes; a release before that only wakes it (no hand-off).
    while not _listening(r, sem) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.release()  # hands the permit to the standby, tops the standbys up
    waiter.join(5)
    assert got and got[0] is not None
    assert published.payloads() == [b"first", b"second"]
