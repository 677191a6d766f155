"""Deadlines hold while Redis does not answer (issue 13, item 8), and dead lock
waiters are dropped while the lock stays held (item 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core.notifier import Notifier
from celery_redislock.core.scripts import reply_deadline
from tests.faults import FaultProxy


def _primitive(client: redis.Redis, kind: str) -> RedisLock | RedisSemaphore:
    """A lock or a one-permit semaphore named "job" on ``client``."""
    return RedisLock(client, "job") if kind == "lock" else RedisSemaphore(client, "job", limit=1)


def _timed_out_while_paused(fault_proxy: FaultProxy, call: Callable[[], object]) -> float:
    """Seconds ``call`` took to raise ``redis.TimeoutError`` while Redis does not
    answer (the proxy paused, as when Redis is SIGSTOPped; resumed after)."""
    started = time.monotonic()
    fault_proxy.pause()
    try:
        with pytest.raises(redis.TimeoutError):
            call()
    finally:
        elapsed = time.monotonic() - started
        fault_proxy.resume()
    return elapsed


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_waiter_returns_by_its_deadline_while_redis_is_paused(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str
) -> None:
    holder = _primitive(r, kind).acquire()
    assert holder is not None
    client = fault_proxy.client()  # redis-py's defaults: a 5 s socket timeout, Retry x10
    primitive = _primitive(client, kind)
    assert primitive.acquire(blocking=False) is None  # connected; scripts cached
    time.sleep(0.1)
    elapsed = _timed_out_while_paused(fault_proxy, lambda: primitive.acquire(timeout=1.0))
    # Before: the blocked read waited out the socket timeout (and its retries).
    assert elapsed < 1.5, elapsed
    assert holder.release()
    client.close()


def test_a_tiny_timeout_does_not_wait_for_a_subscription(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = RedisLock(r, "job").acquire()
    assert holder is not None
    # A SUBSCRIBE that is never confirmed (Redis slow to answer it).
    monkeypatch.setattr(Notifier, "_subscribe", lambda self, channel, entry: None)
    started = time.monotonic()
    assert RedisLock(r, "job").acquire(timeout=0.05) is None
    # Before: the confirmation wait (1 s) ignored the caller's deadline.
    assert time.monotonic() - started < 0.5
    assert holder.release()


_WAITER = """
import sys, redis
from celery_redislock import RedisLock
lock = RedisLock(redis.Redis.from_url(sys.argv[1]), "job")
print("waiting", flush=True)
lock.acquire(timeout=60)
"""


def test_dead_waiters_are_dropped_while_the_lock_is_held(r: redis.Redis, redis_url: str) -> None:
    lock = RedisLock(r, "job", ttl=30, renew=True)
    holder = lock.acquire()
    assert holder is not None
    dead = subprocess.Popen([sys.executable, "-c", _WAITER, redis_url], stdout=subprocess.PIPE)
    try:
        assert dead.stdout is not None and dead.stdout.readline() == b"waiting\n"
        deadline = time.monotonic() + 5
        while lock.info().waiters < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.info().waiters == 1
        os.kill(dead.pid, signal.SIGKILL)
    finally:
        dead.wait(10)
        if dead.stdout is not None:
            dead.stdout.close()
    live = RedisLock(r, "job")
    results: list[Any] = []
    import threading

    waiter = threading.Thread(target=lambda: results.append(live.acquire(timeout=7)))
    waiter.start()
    time.sleep(6.0)  # past the dead waiter's 5 s heartbeat; the lock held all along
    # Before: reaped only when the lock was free or released -- counted for ever.
    assert lock.info().waiters == 1
    assert r.zcard(lock.keys.queue) == 1
    assert holder.release()
    waiter.join(5)
    assert results and results[0] is not None and results[0].release()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_info_counts_only_waiters_whose_heartbeat_has_not_lapsed(r: redis.Redis, kind: str) -> None:
    primitive = _primitive(r, kind)
    holder = primitive.acquire()
    assert holder is not None
    assert primitive.acquire(timeout=0.05) is None  # a waiter that left
    r.zadd(primitive.keys.queue, {"dead.00000000": 1})  # one that died queued:
    r.zadd(primitive.keys.alive, {"dead.00000000": 1})  # its heartbeat long lapsed
    assert primitive.info().waiters == 0  # nobody polled since to reap it
    assert holder.release()


class _PreEightConnection(redis.Connection):
    """redis-py < 8's ``read_response``: no ``timeout`` parameter (5.3 to 7.4)."""

    def read_response(  # type: ignore[override]
        self,
        disable_decoding: bool = False,
        *,
        disconnect_on_error: bool = True,
        push_request: bool = False,
    ) -> Any:
        return super().read_response(
            disable_decoding, disconnect_on_error=disconnect_on_error, push_request=push_request
        )


def test_a_deadline_holds_on_a_connection_whose_read_takes_no_timeout(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    holder = RedisLock(r, "job").acquire()
    assert holder is not None
    client = fault_proxy.client(socket_timeout=5.0)
    client.connection_pool.connection_class = _PreEightConnection
    lock = RedisLock(client, "job")
    assert lock.acquire(blocking=False) is None  # connected; scripts cached
    time.sleep(0.1)
    # Before: every read with a deadline raised TypeError on redis-py < 8.
    elapsed = _timed_out_while_paused(fault_proxy, lambda: lock.acquire(timeout=1.0))
    assert elapsed < 1.5, elapsed
    # A read with a deadline that Redis answers (no waiting: redis-py 8's own PubSub
    # would pass its read a timeout this connection class does not take).
    with reply_deadline(time.monotonic() + 1.0):
        assert lock.acquire(blocking=False) is None
    conn = client.connection_pool.get_connection()
    assert isinstance(conn, _PreEightConnection) and conn._sock is not None
    assert conn._sock.gettimeout() == 5.0  # the per-read timeout was undone
    client.connection_pool.release(conn)
    assert holder.release()
    client.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_deadline_holds_when_the_notifier_is_already_subscribed(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str
) -> None:
    holder = _primitive(r, kind).acquire()
    assert holder is not None
    client = fault_proxy.client()  # redis-py's defaults: a 5 s socket timeout, Retry x10
    primitive = _primitive(client, kind)
    # A first wait subscribes the notifier; the channel stays subscribed after it.
    assert primitive.acquire(timeout=0.2) is None
    time.sleep(0.1)
    elapsed = _timed_out_while_paused(fault_proxy, lambda: primitive.acquire(timeout=1.0))
    # Before: a read skipped the deadline cap once subscribed, and took ~6 s.
    assert elapsed < 2.5, elapsed
    deadline = time.monotonic() + 10  # left the queue, or its 5 s heartbeat lapsed
    while primitive.info().waiters and time.monotonic() < deadline:
        time.sleep(0.05)
    assert primitive.info().waiters == 0
    assert holder.release()
    client.close()
