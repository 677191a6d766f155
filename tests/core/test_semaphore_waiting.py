"""RedisSemaphore waiters: FIFO when fair, no herd, leaving, barging (one process)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_redislock import Lease, RedisSemaphore
from celery_redislock.core import semaphore_scripts


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition on Redis's state (not a sleep standing in for an event)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


@pytest.fixture
def woken(r: redis.Redis) -> Iterator[Callable[[RedisSemaphore], list[str]]]:
    """Subscribe to a semaphore's wake channel; return a function draining it."""
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]

    def drain(sem: RedisSemaphore) -> list[str]:
        if not pubsub.subscribed:
            pubsub.subscribe(sem.keys.channel)
            assert pubsub.get_message(timeout=2)["type"] == "subscribe"
            return []
        names = []
        while (message := pubsub.get_message(timeout=0.2)) is not None:
            names.append(message["data"].decode())
        return names

    yield drain
    pubsub.close()


def queue_waiters(sem: RedisSemaphore, names: list[str]) -> None:
    """Queue ``names`` as waiters, in that order, through the acquire script."""
    for name in names:
        assert sem._attempt(name, "", 5000, True)[0] == 0


def queued(r: redis.Redis, sem: RedisSemaphore, count: int) -> bool:
    """True once ``count`` waiters are queued."""
    return bool(r.zcard(sem.keys.queue) == count)


def make_stale(r: redis.Redis, sem: RedisSemaphore, token: str) -> None:
    """Set ``token``'s heartbeat deadline under half a heartbeat away: a release then
    wakes it (it may be dead) instead of granting it a permit."""
    seconds, micros = r.time()
    r.zadd(sem.keys.alive, {token: seconds * 1000 + micros // 1000 + 1500})


def test_release_grants_each_freed_permit_to_the_next_waiter_only(
    r: redis.Redis, woken: Callable[[RedisSemaphore], list[str]]
) -> None:
    sem = RedisSemaphore(r, "s", limit=3)
    held = [sem.acquire() for _ in range(3)]
    woken(sem)
    queue_waiters(sem, ["w0", "w1", "w2", "w3"])
    assert woken(sem) == []
    assert held[0] and held[0].release()
    [message] = woken(sem)  # one permit: the first waiter only, no herd
    token, fence = message.split()
    assert token == "w0" and held[2] and int(fence) > held[2].fence
    assert r.zscore(sem.keys.holders, "w0") is not None  # granted: "w0" need not ask
    time.sleep(0.2)  # its own later attempt finds the grant, with the TTL it has left
    granted, found, _, left = sem._attempt("w0", "", 5000, True)
    assert (granted, found) == (1, int(fence)) and 4000 < left <= 4800
    assert held[1] and held[1].release()
    assert [m.split()[0] for m in woken(sem)] == ["w1"]
    assert r.zrange(sem.keys.queue, 0, -1) == [b"w2", b"w3"]
    assert r.hkeys(sem.keys.asks) == [b"w2", b"w3"]
    assert sem._leave("w0") == int(fence)  # granted already: leaving says so
    assert sem._leave("w3") == 0 and woken(sem) == []  # all held: nobody to wake


def test_a_dead_head_is_reaped_and_the_permit_granted_to_the_next_waiter(
    r: redis.Redis, woken: Callable[[RedisSemaphore], list[str]]
) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    held = sem.acquire()
    woken(sem)
    queue_waiters(sem, ["w0", "w1"])
    r.zadd(sem.keys.alive, {"w0": 0})  # w0's heartbeat lapsed: it died queued
    assert held and held.release()
    [message] = woken(sem)
    assert message.split()[0] == "w1"  # granted past the dead head
    assert r.zscore(sem.keys.holders, "w1") is not None
    for key in (sem.keys.queue, sem.keys.alive, sem.keys.asks):
        assert not r.exists(key)


def test_release_wakes_the_waiters_it_cannot_grant(
    r: redis.Redis, woken: Callable[[RedisSemaphore], list[str]]
) -> None:
    sem = RedisSemaphore(r, "s", limit=3)
    held = [sem.acquire() for _ in range(3)]
    woken(sem)
    queue_waiters(sem, ["w0", "w1", "w2", "w3"])
    make_stale(r, sem, "w0")
    assert held[0] and held[0].release()
    assert woken(sem) == ["w0"]  # told, not granted; nobody else
    assert r.zscore(sem.keys.holders, "w0") is None
    assert held[1] and held[1].release()
    assert woken(sem) == ["w1"]  # w0 was told already; w1 is eligible, not granted
    assert sem._leave("w0") == 0  # w0 gives up its place: w2 takes it
    assert woken(sem) == ["w2"]
    assert sem._leave("w3") == 0 and woken(sem) == []  # not eligible


def test_fair_wakes_the_head_only_and_each_grant_the_next(
    r: redis.Redis, woken: Callable[[RedisSemaphore], list[str]]
) -> None:
    sem = RedisSemaphore(r, "s", limit=3, fair=True)
    held = [sem.acquire() for _ in range(3)]
    woken(sem)
    queue_waiters(sem, ["w0", "w1", "w2"])
    make_stale(r, sem, "w0")  # so the release wakes it rather than granting it
    assert held[0] and held[0].release()
    assert woken(sem) == ["w0"]
    assert held[1] and held[1].release()
    assert woken(sem) == []  # two permits free, but only the head may take one
    assert sem._attempt("w1", "", 5000, True)[0] == 0  # not its turn
    assert sem._attempt("w0", "", 5000, True)[0] == 1
    assert woken(sem) == ["w1"]  # the grant passes the turn on
    assert sem._leave("w1") == 0  # the head gives up: w2's turn
    assert woken(sem) == ["w2"]


def test_fair_keeps_free_permits_for_the_queue_head(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, fair=True)
    lease = sem.acquire()
    queue_waiters(sem, ["w0"])
    assert lease and lease.release()
    assert sem.acquire(blocking=False) is None  # a newcomer does not jump the queue
    assert sem._attempt("w1", "", 5000, True)[0] == 0  # nor does a later waiter
    assert sem._attempt("w0", "", 5000, True)[0] == 1


def test_non_fair_lets_a_newcomer_take_a_free_permit(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semaphore_scripts, "PATIENCE_MS", 60_000.0)  # nobody starves here
    sem = RedisSemaphore(r, "s", limit=1)
    lease = sem.acquire()
    queue_waiters(sem, ["w0"])
    assert lease and lease.release()
    assert sem.acquire(blocking=False) is not None
    assert sem._attempt("w0", "", 5000, True)[0] == 0  # w0 keeps its place and waits


def test_non_fair_stops_barging_once_a_waiter_starves(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semaphore_scripts, "PATIENCE_MS", 0.0)  # every waiter starves
    sem = RedisSemaphore(r, "s", limit=2)
    held = [sem.acquire(), sem.acquire()]
    queue_waiters(sem, ["w0", "w1", "w2"])
    assert held[0] and held[0].release() and held[1] and held[1].release()
    assert sem.acquire(blocking=False) is None  # the two free permits are w0's and w1's
    assert sem._attempt("w2", "", 5000, True)[0] == 0  # so is the third in line refused
    assert sem._attempt("w1", "", 5000, True)[0] == 1  # any of the first two may go
    assert sem._attempt("w0", "", 5000, True)[0] == 1


def test_a_release_is_sent_to_the_waiter_s_own_process_channel(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    lease = sem.acquire()
    assert lease is not None
    tag = lease.token.rsplit(".", 1)[1]
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.psubscribe(f"{sem.keys.channel}*")
    assert pubsub.get_message(timeout=2)["type"] == "psubscribe"
    waiter = threading.Thread(target=lambda: _timed_acquire(sem, 5))
    waiter.start()
    wait_for(lambda: r.zcard(sem.keys.queue) == 1)
    lease.release()
    waiter.join(5)
    message = pubsub.get_message(timeout=2)
    pubsub.close()
    assert message is not None and message["channel"].decode() == f"{sem.keys.channel}:{tag}"


@pytest.mark.parametrize("fair", [True, False])
def test_release_wakes_a_blocked_waiter_at_once(r: redis.Redis, fair: bool) -> None:
    sem = RedisSemaphore(r, "s", limit=1, fair=fair)
    lease = sem.acquire()
    got: list[float] = []
    waiter = threading.Thread(target=lambda: got.append(_timed_acquire(sem, 5)))
    waiter.start()
    wait_for(lambda: r.zcard(sem.keys.queue) == 1)
    released_at = time.monotonic()
    assert lease and lease.release()
    waiter.join(5)
    assert got and got[0] - released_at < 0.2  # the message, not the 1 s poll


def _timed_acquire(sem: RedisSemaphore, timeout: float) -> float:
    lease = sem.acquire(timeout=timeout)
    assert lease is not None
    done = time.monotonic()
    lease.release()
    return done


def test_fair_grants_in_request_order(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=2, fair=True, ttl=10)
    held = [sem.acquire(), sem.acquire()]
    grants: list[tuple[int, int]] = []  # (fence, waiter index): fences give grant order

    def waiter(index: int) -> None:
        lease = sem.acquire(timeout=20)
        assert lease is not None
        grants.append((lease.fence, index))
        time.sleep(0.01)
        lease.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(6)]
    for count, thread in enumerate(threads, 1):
        thread.start()
        wait_for(functools.partial(queued, r, sem, count))
    for lease in held:
        assert lease and lease.release()
    for thread in threads:
        thread.join(20)
    assert [index for _, index in sorted(grants)] == list(range(6))


def test_a_timed_out_waiter_leaves_and_the_next_is_woken(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, fair=True)
    lease = sem.acquire()
    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.update(first=sem.acquire(timeout=0.3)))
    first.start()
    wait_for(lambda: r.zcard(sem.keys.queue) == 1)
    second = threading.Thread(target=lambda: results.update(second=_timed_acquire(sem, 5)))
    second.start()
    wait_for(lambda: r.zcard(sem.keys.queue) == 2)
    first.join(5)
    assert results["first"] is None and r.zcard(sem.keys.queue) == 1  # left at once
    released_at = time.monotonic()
    assert lease and lease.release()
    second.join(5)
    assert results["second"] - released_at < 0.2


def test_noscript_during_a_blocking_wait(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    lease = sem.acquire()
    got: list[Lease | None] = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=5)))
    waiter.start()
    wait_for(lambda: r.zcard(sem.keys.queue) == 1)
    r.script_flush()
    assert lease and lease.release()
    waiter.join(5)
    assert got and got[0] is not None and got[0].release()
