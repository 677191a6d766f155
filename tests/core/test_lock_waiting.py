"""Blocking acquire: wake-ups, FIFO order, timeouts, lost messages and crashed holders."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_redislock import Lease, RedisLock
from celery_redislock.core import lock as lock_module
from celery_redislock.core import lock_scripts
from celery_redislock.core import primitive as primitive_module
from celery_redislock.core import waiting as waiting_module
from celery_redislock.core.waiting import MAX_POLL


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


class Waiter(threading.Thread):
    """A thread blocked in ``lock.acquire(**kwargs)``; records when it returned."""

    def __init__(self, lock: RedisLock, hold: float = 0.0, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.lock, self.hold, self.kwargs = lock, hold, kwargs
        self.lease: Lease | None = None
        self.returned_at = 0.0
        self.error: BaseException | None = None
        self.order: list[Any] | None = None
        self.label: Any = None

    def run(self) -> None:
        try:
            self.lease = self.lock.acquire(**self.kwargs)
            self.returned_at = time.monotonic()
            if self.lease is not None:
                if self.order is not None:
                    self.order.append(self.label)
                time.sleep(self.hold)
                if self.hold:
                    self.lease.release()
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc

    def result(self, timeout: float = 10.0) -> Lease | None:
        self.join(timeout)
        assert not self.is_alive(), "waiter still blocked"
        assert self.error is None, self.error
        return self.lease


@pytest.fixture
def lock(r: redis.Redis, request: pytest.FixtureRequest) -> RedisLock:
    # A name of its own per test: earlier tests' subscribers may linger on theirs.
    return RedisLock(r, f"wait-{request.node.name}", ttl=30)


@pytest.fixture
def waiters() -> Iterator[list[Waiter]]:
    started: list[Waiter] = []
    yield started
    for waiter in started:
        waiter.join(15)


def start_waiter(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter], queued: int | None = None, **kwargs: Any
) -> Waiter:
    """Start a waiter and return once ``queued`` waiters stand in the lock's queue."""
    waiter = Waiter(lock, **kwargs)
    waiters.append(waiter)
    waiter.start()
    if queued is not None:
        wait_for(lambda: r.zcard(lock.keys.queue) >= queued)
    return waiter


# -- wake-up on release ------------------------------------------------------------------


def test_release_wakes_a_blocked_waiter_promptly(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    # The fallback poll sleeps MAX_POLL (1 s) at a time: only the notification can make
    # every hand-off this fast.
    assert MAX_POLL >= 1.0
    latencies = []
    for i in range(5):
        holder = lock.acquire()
        assert holder is not None
        waiter = start_waiter(r, lock, waiters, queued=1, timeout=10)
        time.sleep(0.05 + 0.05 * i)  # waiter is asleep, at various points of its poll
        released_at = time.monotonic()
        assert holder.release()
        lease = waiter.result()
        assert lease is not None
        latencies.append(waiter.returned_at - released_at)
        assert lease.release()
    assert statistics.median(latencies) < 0.2, latencies
    assert max(latencies) < 0.5, latencies


def test_waiters_are_served_in_fifo_order(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    holder = lock.acquire()
    assert holder is not None
    order: list[int] = []
    for i in range(6):
        waiter = Waiter(lock, hold=0.01, timeout=15)
        waiter.order, waiter.label = order, i
        waiters.append(waiter)
        waiter.start()
        wait_for(lambda n=i + 1: r.zcard(lock.keys.queue) == n)  # type: ignore[misc]
    assert lock.info().waiters == 6
    # One subscriber connection for the whole process, whatever the number of waiters,
    # on the lock's channel for this process.
    channels = r.pubsub_channels(f"{lock.keys.channel}*")
    tag = primitive_module.fresh_token()[1]
    assert channels == [f"{lock.keys.channel}:{tag}".encode()]
    assert r.pubsub_numsub(channels[0]) == [(channels[0], 1)]
    started = time.monotonic()
    holder.release()
    for waiter in waiters:
        assert waiter.result() is not None
    assert order == list(range(6))
    assert time.monotonic() - started < 3  # six notified hand-offs, no poll rounds
    assert r.zcard(lock.keys.queue) == 0


def test_newcomer_does_not_barge_past_a_queued_waiter(r: redis.Redis, lock: RedisLock) -> None:
    holder = lock.acquire()
    assert holder is not None
    # A queued waiter (via the script: no thread that would take the lock at once).
    reply = lock_scripts.ACQUIRE(
        r,
        [lock.keys.holders, lock.keys.fence, lock.keys.queue, lock.keys.alive, lock.keys.asks],
        ["a" * 32, 30000, "", "1"],
    )
    assert reply[0] == 0
    holder.release()
    assert not lock.locked()
    assert lock.acquire(blocking=False) is None  # free, but promised to the queued one
    assert lock.acquire(blocking=False, owner="x") is None


def test_dead_waiter_is_dropped_after_its_heartbeat(r: redis.Redis, lock: RedisLock) -> None:
    keys = [lock.keys.holders, lock.keys.fence, lock.keys.queue, lock.keys.alive, lock.keys.asks]
    args = ["d" * 32, 30000, "", "1"]
    holder = lock.acquire()
    assert holder is not None
    assert lock_scripts.ACQUIRE(r, keys, args)[0] == 0  # queued; then it "dies"
    holder.release()
    assert lock.acquire(blocking=False) is None
    r.zadd(lock.keys.alive, {"d" * 32: 0})  # its heartbeat deadline has passed
    lease = lock.acquire(blocking=False)
    assert lease is not None
    assert r.zcard(lock.keys.queue) == 0
    lease.release()


# -- timeouts -----------------------------------------------------------------------------


def test_timeout_returns_none_and_leaves_the_queue(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    holder = lock.acquire()
    assert holder is not None
    started = time.monotonic()
    waiter = start_waiter(r, lock, waiters, timeout=0.3)
    assert waiter.result() is None
    assert 0.25 <= waiter.returned_at - started < 1.0
    assert r.zcard(lock.keys.queue) == 0 and r.zcard(lock.keys.alive) == 0
    assert lock.locked() and holder.release()


def test_waiter_behind_a_timed_out_one_is_woken_promptly(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    holder = lock.acquire()
    assert holder is not None
    impatient = start_waiter(r, lock, waiters, queued=1, timeout=0.3)
    patient = start_waiter(r, lock, waiters, queued=2, timeout=10)
    assert impatient.result() is None
    assert r.zcard(lock.keys.queue) == 1  # the impatient one left the queue
    released_at = time.monotonic()
    holder.release()
    lease = patient.result()
    assert lease is not None
    # Had the impatient waiter stayed queued, the patient one would wait for its
    # heartbeat to lapse (5 s).
    assert patient.returned_at - released_at < 0.5
    lease.release()


def test_leaving_head_of_a_free_lock_wakes_the_next_waiter(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    keys = [lock.keys.holders, lock.keys.fence, lock.keys.queue, lock.keys.alive, lock.keys.asks]
    head = "h" * 32
    holder = lock.acquire()
    assert holder is not None
    assert lock_scripts.ACQUIRE(r, keys, [head, 30000, "", "1"])[0] == 0
    waiter = start_waiter(r, lock, waiters, queued=2, timeout=10)
    holder.release()  # wakes the head, which never comes ...
    time.sleep(0.1)
    assert waiter.is_alive()
    left_at = time.monotonic()  # ... until it gives up, which must wake the next one
    lock_scripts.LEAVE(
        r, [lock.keys.holders, lock.keys.queue, lock.keys.alive, lock.keys.asks], [head, "lock"]
    )
    lease = waiter.result()
    assert lease is not None and waiter.returned_at - left_at < 0.5
    lease.release()


def test_interrupted_waiter_leaves_the_queue(
    r: redis.Redis, lock: RedisLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = lock.acquire()
    assert holder is not None
    original = lock_module.wait_until_granted
    queued: list[int] = []

    def interrupt_once_queued(*args: Any, **kwargs: Any) -> bool:
        attempt = args[3]

        def attempt_then_interrupt() -> int | None:
            attempt()
            queued.append(int(r.zcard(lock.keys.queue)))
            raise KeyboardInterrupt  # e.g. Ctrl-C while waiting

        return original(*args[:3], attempt_then_interrupt, *args[4:], **kwargs)

    monkeypatch.setattr(lock_module, "wait_until_granted", interrupt_once_queued)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(timeout=5)
    assert queued == [1]
    assert r.zcard(lock.keys.queue) == 0 and r.zcard(lock.keys.alive) == 0
    holder.release()


def test_release_hands_the_lock_to_the_waiter_before_it_asks_again(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    holder = lock.acquire()
    assert holder is not None
    waiter = start_waiter(r, lock, waiters, queued=1, timeout=10, owner="next", ttl=7)
    assert holder.release()
    # Granted by the release itself: held by the waiter's owner with the TTL it asked
    # for, whatever the waiter's thread is doing.
    held = r.hgetall(lock.keys.holders)
    assert held[b"owner"] == b"next" and 6000 < r.pttl(lock.keys.holders) <= 7000
    lease = waiter.result()
    assert lease is not None and lease.owner == "next"
    assert int(held[b"fence"]) == lease.fence and 6.0 < lease.remaining() <= 7.0
    assert lease.release() and not lock.locked()


def test_timeout_zero_tries_once_even_when_subscribed(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter], monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = lock.acquire()
    assert holder is not None
    waiter = start_waiter(r, lock, waiters, queued=1, timeout=10)  # subscribes the channel
    assert holder.release()
    lease = waiter.result()
    assert lease is not None

    def no_wait(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("timeout=0 must not queue and wait")

    monkeypatch.setattr(lock_module, "wait_until_granted", no_wait)
    assert lock.acquire(timeout=0) is None  # one refused attempt, never queued
    assert r.zcard(lock.keys.queue) == 0
    assert lease.release() and not lock.locked()


def test_poll_slice_keeps_a_short_lease_mostly_ahead() -> None:
    # A grant by message counts from the waiter's last request: requests of a short
    # lease's waiter are close enough together that it starts with most of its TTL.
    assert waiting_module.poll_slice(30_000) == MAX_POLL
    assert waiting_module.poll_slice(600) == pytest.approx(0.2)


def test_interrupt_after_a_grant_gives_the_lock_back(
    r: redis.Redis, lock: RedisLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = lock.acquire()
    assert holder is not None
    original = lock_module.wait_until_granted

    def grant_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        attempt = args[3]

        def attempt_then_interrupt() -> Any:
            attempt()
            holder.release()  # grants the lock to this waiter ...
            assert r.hexists(lock.keys.holders, "owner")
            raise KeyboardInterrupt  # ... which is interrupted before it learns so

        return original(*args[:3], attempt_then_interrupt, *args[4:], **kwargs)

    monkeypatch.setattr(lock_module, "wait_until_granted", grant_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(timeout=5, owner="interrupted")
    assert not lock.locked()  # its grant was given back, not left for a whole TTL
    assert r.zcard(lock.keys.queue) == 0 and r.hlen(lock.keys.asks) == 0


def test_grant_made_while_timing_out_is_kept(
    r: redis.Redis, lock: RedisLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = lock.acquire()
    assert holder is not None
    original = lock_module.wait_until_granted

    def grant_just_before_leaving(*args: Any, **kwargs: Any) -> Any:
        leave = args[4]

        def release_then_leave() -> int:
            holder.release()  # the grant lands after the waiter's last attempt
            return int(leave())

        return original(*args[:4], release_then_leave, *args[5:], **kwargs)

    monkeypatch.setattr(lock_module, "wait_until_granted", grant_just_before_leaving)
    lease = lock.acquire(timeout=0.3, owner="late")
    # Leaving the queue found the grant: it was made in time, so the waiter keeps it.
    assert lease is not None and lease.owner == "late" and lease.remaining() > 25
    assert r.hget(lock.keys.holders, "owner") == b"late"
    assert r.zcard(lock.keys.queue) == 0 and r.hlen(lock.keys.asks) == 0
    assert lease.release() and not lock.locked()


# -- lost notifications, crashed holders ---------------------------------------------------


def test_lost_notification_costs_latency_not_liveness(
    r: redis.Redis, lock: RedisLock, waiters: list[Waiter]
) -> None:
    holder = lock.acquire()
    assert holder is not None
    waiter = start_waiter(r, lock, waiters, queued=1, timeout=10)
    freed_at = time.monotonic()
    r.delete(lock.keys.holders)  # the lock frees without any message
    lease = waiter.result()
    assert lease is not None
    assert waiter.returned_at - freed_at < MAX_POLL + 0.5
    lease.release()


def test_waiter_gets_an_unreleased_lock_right_after_its_ttl(
    r: redis.Redis, waiters: list[Waiter]
) -> None:
    lock = RedisLock(r, "ttl-wait", ttl=0.4)
    holder = lock.acquire()  # never released
    granted_at = time.monotonic()
    assert holder is not None
    waiter = start_waiter(r, lock, waiters, queued=1, timeout=10)
    lease = waiter.result()
    assert lease is not None and lease.fence > holder.fence
    assert 0.3 <= waiter.returned_at - granted_at < 0.4 + 0.4


HOLDER = textwrap.dedent(
    """
    import sys, time, redis
    from celery_redislock import RedisLock
    lease = RedisLock(redis.Redis.from_url(sys.argv[1]), "crash", ttl=1.0).acquire()
    print(lease.fence, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_holder_lock_passes_to_a_waiter_within_its_ttl(
    r: redis.Redis, redis_url: str, waiters: list[Waiter]
) -> None:
    lock = RedisLock(r, "crash", ttl=30)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        fence = int(proc.stdout.readline())
        acquired_at = time.monotonic()  # the holder's grant was at most this long ago
        assert lock.locked()
        waiter = start_waiter(r, lock, waiters, queued=1, timeout=10)
        proc.kill()
        proc.wait(5)
        killed_at = time.monotonic()
        lease = waiter.result()
        assert lease is not None and lease.fence > fence
        # Free 1 s after the grant; the waiter's poll is capped by the TTL left.
        assert waiter.returned_at - acquired_at < 1.0 + 0.5
        assert waiter.returned_at > killed_at
        lease.release()
    finally:
        proc.kill()
        proc.wait(5)
        if proc.stdout:
            proc.stdout.close()


# -- threads sharing one lock object ---------------------------------------------------------


def test_with_blocks_in_threads_release_their_own_lease(r: redis.Redis) -> None:
    lock = RedisLock(r, "threads", ttl=30)
    inside: list[str] = []
    tokens: dict[str, str] = {}
    errors: list[BaseException] = []

    def body(label: str) -> None:
        try:
            for _ in range(10):
                with lock as lease:
                    inside.append(label)
                    assert len(inside) == 1, inside
                    tokens[label] = lease.token
                    assert r.hkeys(lock.keys.holders).count(f"t:{lease.token}".encode()) == 1
                    time.sleep(0.002)
                    inside.remove(label)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(str(i),)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(tokens) == 4 and not lock.locked()


def test_forked_child_waits_with_its_own_subscriber(r: redis.Redis, lock: RedisLock) -> None:
    # The parent's notifier (reader thread, subscriber connection) is running ...
    holder = lock.acquire()
    assert holder is not None
    warm = Waiter(lock, hold=0.0, timeout=5)
    warm.start()
    wait_for(lambda: r.zcard(lock.keys.queue) == 1)
    holder.release()
    first = warm.result()
    assert first is not None
    # ... and a forked child blocks on the lock: it must be woken by a subscriber of
    # its own (the parent's thread does not exist there), not by the 1 s poll.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 9
        try:
            queued_at = time.monotonic()
            lease = lock.acquire(timeout=10)
            waited = time.monotonic() - queued_at
            code = 2 if lease is None else 0 if waited < 5 else 3
            if lease is not None:
                lease.release()
        finally:
            os._exit(code)
    try:
        wait_for(lambda: r.zcard(lock.keys.queue) == 1)
        time.sleep(0.1)
        # The parent's subscriber and the child's, each on its process's channel.
        channels = r.pubsub_channels(f"{lock.keys.channel}:*")
        assert len(channels) == 2
        assert all(count == 1 for _, count in r.pubsub_numsub(*channels))
        released_at = time.monotonic()
        first.release()
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.002)
        else:  # pragma: no cover
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("child hung")
        assert status is not None and os.waitstatus_to_exitcode(status) == 0
        assert time.monotonic() - released_at < 0.5  # woken, not polled
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
