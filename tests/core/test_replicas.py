"""Replica acknowledgement on a single Redis (no replicas): refused grants are
released and raised, bad settings are ConfigurationErrors, WAITAOF is detected.
The Sentinel suite (tests/topologies) covers the granted side with real replicas."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock import ConfigurationError, NotReplicated, RedisLock, RedisSemaphore
from celery_redislock.errors import RedisLockError


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 1.5}, "min_replicas"),
        ({"min_replicas": True}, "min_replicas"),
        ({"min_replicas": 1, "replica_timeout": 0}, "replica_timeout"),
        ({"min_replicas": 1, "replica_timeout": float("inf")}, "replica_timeout"),
        ({"min_replicas": 1, "replica_timeout": "1"}, "replica_timeout"),
        ({"wait_aof": "yes"}, "wait_aof"),
    ],
)
def test_bad_replica_settings_name_the_argument(
    r: redis.Redis, kwargs: dict[str, object], named: str
) -> None:
    for make in (
        lambda: RedisLock(r, "x", **kwargs),  # type: ignore[arg-type]
        lambda: RedisSemaphore(r, "x", limit=2, **kwargs),
    ):  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=named) as caught:
            make()
        assert isinstance(caught.value, ValueError)
        assert repr(kwargs[named]) in str(caught.value)


def test_unacknowledged_grant_is_released_and_raised(r: redis.Redis) -> None:
    lock = RedisLock(r, "acks", ttl=10, min_replicas=1, replica_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(NotReplicated) as caught:
        lock.acquire(blocking=False)
    elapsed = time.monotonic() - started
    assert 0.15 <= elapsed < 2.0  # waited for the replica, bounded by replica_timeout
    assert isinstance(caught.value, RedisLockError)
    assert (caught.value.name, caught.value.wanted, caught.value.acked) == ("acks", 1, 0)
    assert "min_replicas=1" in str(caught.value)
    assert not lock.locked()  # released: nobody holds a lease it may not trust
    assert RedisLock(r, "acks").acquire(blocking=False) is not None


def test_semaphore_grant_is_released_and_raised(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "acks", limit=1, min_replicas=2, replica_timeout=0.1)
    with pytest.raises(NotReplicated):
        sem.acquire(blocking=False)
    assert sem.info().holders == []
    assert RedisSemaphore(r, "acks", limit=1).acquire(blocking=False) is not None


def test_handed_over_grant_is_confirmed_too(r: redis.Redis) -> None:
    # A waiter granted by another client's release (no write of its own) still waits
    # for replicas: the confirmation writes on its own connection before WAIT.
    holder = RedisLock(r, "handover", ttl=10).acquire()
    assert holder is not None
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            RedisLock(r, "handover", ttl=10, min_replicas=1, replica_timeout=0.1).acquire(timeout=5)
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert holder.release()
    waiter.join(5)
    assert [type(e) for e in errors] == [NotReplicated]
    assert not RedisLock(r, "handover").locked()


def test_releases_never_wait(r: redis.Redis) -> None:
    lock = RedisLock(r, "release", min_replicas=0)  # 0: grants count at once
    lease = lock.acquire()
    assert lease is not None
    started = time.monotonic()
    assert lease.release()
    assert time.monotonic() - started < 0.1


def test_wait_aof_is_refused_clearly_where_unsupported(r: redis.Redis) -> None:
    lock = RedisLock(r, "aof", wait_aof=True, replica_timeout=0.2)
    with pytest.raises(ConfigurationError, match="wait_aof"):
        lock.acquire(blocking=False)
    assert not lock.locked()


def test_replica_timeout_must_fit_in_the_socket_timeout(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=0.5)
    try:
        with pytest.raises(ConfigurationError, match=r"replica_timeout.*socket_timeout"):
            RedisLock(client, "x", min_replicas=1, replica_timeout=0.5)
        RedisLock(client, "x", min_replicas=1, replica_timeout=0.4)
    finally:
        client.close()
