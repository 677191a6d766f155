"""Replies are read by shape, not by luck (issue 13, item 10).

An interrupt between redis-py sending a command and reading its reply (outside
redis-py's own guard) leaves the reply in flight on a pooled connection; the next
command on that connection reads it. The proxy delays replies so the stale one is
still in flight when the connection is next used (redis-py checks a connection for
unread data only when it hands it out).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.connection import Connection

from celery_redislock import RedisLock
from celery_redislock.core import lock_scripts as lock_module
from celery_redislock.core.notifier import Notifier, Waiter
from tests.faults import FaultProxy


@pytest.fixture
def slow(r: redis.Redis, fault_proxy: FaultProxy) -> Iterator[redis.Redis]:
    """A client through the proxy, replies and requests 50 ms late each way."""
    client = fault_proxy.client(socket_timeout=5)
    client.ping()
    fault_proxy.delay = 0.05
    yield client
    client.close()


def interrupt_next_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next ``read_response`` raises KeyboardInterrupt before reading anything,
    as a signal handler would right after the command was sent."""
    original = Connection.read_response
    armed = [True]

    def read_response(self: Connection, *args: Any, **kwargs: Any) -> Any:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "read_response", read_response)


def test_another_commands_integer_is_not_a_grant(
    r: redis.Redis, slow: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = RedisLock(r, "job").acquire()
    assert holder is not None
    interrupt_next_read(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        slow.incr("counter")  # its reply, 1, is still on the way
    # Before: the acquire read that 1 as "a new lease with fence 1" -- two holders.
    assert RedisLock(slow, "job").acquire(blocking=False) is None
    assert r.hkeys(holder.holder.keys.holders) and holder.release()  # type: ignore[attr-defined]
    assert slow.get("counter") == b"1"  # the client works on


def test_a_script_interrupted_mid_command_closes_its_connection(
    r: redis.Redis, slow: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    r.set("k", "v")
    lease = RedisLock(slow, "job").acquire()
    assert lease is not None
    interrupt_next_read(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        lease.extend(10)
    # Before: the next command on that connection read the extend's reply (1).
    assert slow.get("k") == b"v"
    assert lease.release()


def test_a_grant_heard_during_clean_up_is_given_back(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = RedisLock(r, "job").acquire()
    assert holder is not None
    lock = RedisLock(r, "job", ttl=30)
    original_wait = Notifier.wait

    def wait(self: Notifier, waiter: Waiter, timeout: float) -> None:
        original_wait(self, waiter, timeout)
        if waiter.fence:  # the release granted us the lock by message: interrupted now
            raise KeyboardInterrupt

    def leave(*args: Any) -> Any:
        raise redis.ConnectionError("Redis unreachable for a moment")

    monkeypatch.setattr(Notifier, "wait", wait)
    monkeypatch.setattr(lock_module, "LEAVE", leave)
    threading.Timer(0.3, holder.release).start()
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(timeout=5)
    # Before: leave() failed, the grant was forgotten and the lock sat held for 30 s.
    assert not lock.locked()
