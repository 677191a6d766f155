"""The core API that users of python-redis-lock and redis-py's ``Lock`` reach for:
``hold()`` with ``LockTimeout``, ``lease.held()``, ``extend(ttl, add=True)`` and
``release_all`` -- against a real redis-server."""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import pytest
import redis
from redis.connection import Connection

from celery_redislock import (
    ConfigurationError,
    LockNotOwned,
    LockTimeout,
    RedisLock,
    RedisLockError,
    RedisSemaphore,
)
from celery_redislock.core import release_all


@pytest.fixture(params=["lock", "semaphore"])
def primitive(request: pytest.FixtureRequest, r: redis.Redis) -> RedisLock | RedisSemaphore:
    if request.param == "lock":
        return RedisLock(r, "job", ttl=10)
    return RedisSemaphore(r, "job", limit=1, ttl=10)


# -- hold() ---------------------------------------------------------------------------


def test_hold_grants_and_releases(primitive: RedisLock | RedisSemaphore) -> None:
    with primitive.hold(timeout=1, owner="me", ttl=5) as lease:
        assert lease.owner == "me" and 4 < lease.remaining() <= 5
        assert lease.held()
    assert lease.released and not lease.held()
    assert primitive.acquire(blocking=False) is not None  # it was given back


def test_hold_non_blocking_raises_lock_timeout_at_once(
    primitive: RedisLock | RedisSemaphore,
) -> None:
    other = primitive.acquire(owner="worker-1")
    assert other is not None
    started = time.monotonic()
    with pytest.raises(LockTimeout) as caught, primitive.hold(blocking=False):
        pytest.fail("the block ran without the lease")
    assert time.monotonic() - started < 0.5
    error = caught.value
    assert isinstance(error, RedisLockError) and isinstance(error, TimeoutError)
    assert error.name == "job" and error.timeout is None
    if isinstance(primitive, RedisLock):
        assert error.holder == "worker-1" and "worker-1" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.name, again.holder) == (str(error), error.name, error.holder)


def test_hold_times_out_after_timeout(primitive: RedisLock | RedisSemaphore) -> None:
    assert primitive.acquire() is not None
    started = time.monotonic()
    with pytest.raises(LockTimeout, match=r"within 0\.3 s") as caught, primitive.hold(timeout=0.3):
        pytest.fail("the block ran without the lease")
    assert 0.25 < time.monotonic() - started < 2.0
    assert caught.value.timeout == 0.3


def test_hold_waits_for_a_release(primitive: RedisLock | RedisSemaphore) -> None:
    first = primitive.acquire()
    assert first is not None
    threading.Timer(0.2, first.release).start()
    with primitive.hold(timeout=5) as lease:
        assert lease.held()


def test_hold_renews_and_reports_a_lost_lease(r: redis.Redis) -> None:
    lock = RedisLock(r, "renewed", ttl=0.5)
    with lock.hold(renew=True) as lease:
        time.sleep(1.2)  # more than two TTLs: alive only by renewal
        assert lease.held()
    with pytest.raises(LockNotOwned), lock.hold() as lease:
        lock.force_release()


def test_hold_rejects_bad_arguments_loudly(r: redis.Redis) -> None:
    lock = RedisLock(r, "job")
    with pytest.raises(TypeError):
        lock.hold(timeuot=1)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="timeout"), lock.hold(timeout=-1):
        pass
    with pytest.raises(ConfigurationError, match="blocking"), lock.hold(blocking="no"):  # type: ignore[arg-type]
        pass


# -- held() ---------------------------------------------------------------------------


def test_held_asks_the_server(r: redis.Redis, primitive: RedisLock | RedisSemaphore) -> None:
    lease = primitive.acquire()
    assert lease is not None and lease.held() and not lease.lost
    lost: list[Any] = []
    lease.on_lost = lost.append
    primitive.force_release()
    assert not lease.lost  # nothing told this process yet ...
    assert lease.held() is False  # ... Redis does
    assert lease.lost and lost == [lease]


def test_held_is_one_read_only_round_trip(r: redis.Redis) -> None:
    lock = RedisLock(r, "job", ttl=10)
    lease = lock.acquire()
    assert lease is not None
    before = r.hgetall(lock.keys.holders), r.pttl(lock.keys.holders)
    calls: list[tuple[Any, ...]] = []
    original = Connection.send_packed_command  # what every command sent goes through

    def counting(self: Connection, *args: Any, **options: Any) -> Any:
        calls.append(args)
        return original(self, *args, **options)

    Connection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        assert lease.held()
    finally:
        Connection.send_packed_command = original  # type: ignore[method-assign]
    assert len(calls) == 1
    assert r.hgetall(lock.keys.holders) == before[0]
    assert r.pttl(lock.keys.holders) <= before[1]


# -- extend(ttl, add=True) ------------------------------------------------------------


def test_extend_add_adds_to_the_time_left(primitive: RedisLock | RedisSemaphore) -> None:
    r = primitive.client
    lease = primitive.acquire(ttl=10)
    assert lease is not None
    assert lease.extend(5, add=True)
    if isinstance(primitive, RedisLock):
        left = r.pttl(primitive.keys.holders)
    else:
        seconds, micros = r.time()
        left = r.zscore(primitive.keys.holders, lease.token) - seconds * 1000 - micros // 1000
    assert 14_000 < left <= 15_000
    assert 14 < lease.remaining() <= 15
    assert lease.extend(2)  # without add the TTL is replaced: shortened to 2 s
    assert lease.remaining() <= 2
    assert lease.held()


def test_extend_add_resent_adds_once(primitive: RedisLock | RedisSemaphore) -> None:
    lease = primitive.acquire(ttl=10)
    assert lease is not None
    first = primitive._add_to_token(lease.token, 5_000, "nonce-1")
    again = primitive._add_to_token(lease.token, 5_000, "nonce-1")  # a re-sent request
    assert 14_000 < first <= 15_000 and again <= first
    assert 15_000 < primitive._add_to_token(lease.token, 1_000, "nonce-2") <= 16_000


def test_extend_add_never_revives_and_checks_arguments(
    primitive: RedisLock | RedisSemaphore,
) -> None:
    lease = primitive.acquire(ttl=0.1)
    assert lease is not None
    with pytest.raises(ConfigurationError, match="ttl"):
        lease.extend(add=True)
    with pytest.raises(ConfigurationError, match="add"):
        lease.extend(1, add="yes")  # type: ignore[arg-type]
    time.sleep(0.2)
    assert lease.extend(5, add=True) is False and lease.lost
    assert primitive.info().holders == []


# -- release_all ----------------------------------------------------------------------


def test_release_all_releases_every_lease_under_the_prefix(r: redis.Redis) -> None:
    other_prefix = RedisLock(r, "report:1", prefix="elsewhere").acquire()
    locks = [RedisLock(r, name, ttl=30) for name in ("report:1", "report:2", "sync{x}")]
    leases = [lock.acquire(owner="t") for lock in locks]
    again = locks[0].acquire(owner="t")  # re-entered: a second lease
    sem = RedisSemaphore(r, "report:api", limit=3)
    permits = [sem.acquire(), sem.acquire()]
    assert all(leases) and again and all(permits) and other_prefix

    assert release_all(r, prefix="redislock", match="report:*", kind="lock") == 3
    assert not locks[0].locked() and not locks[1].locked() and locks[2].locked()
    assert len(sem.info().holders) == 2
    assert release_all(r, prefix="redislock", kind="semaphore") == 2
    assert release_all(r, prefix="redislock") == 1  # sync{x}: braces in the name
    assert release_all(r, prefix="redislock") == 0
    assert other_prefix.held()  # another prefix is untouched
    for lease in [*leases, again, *permits]:
        assert lease is not None and not lease.held()


def test_release_all_wakes_a_waiter(r: redis.Redis) -> None:
    lock = RedisLock(r, "stuck", ttl=60)
    assert lock.acquire() is not None  # a dead process's lock
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10)))
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert release_all(r, prefix="redislock") == 1
    waiter.join(10)
    assert got and got[0] is not None and time.monotonic() - started < 2


def test_release_all_checks_its_arguments(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match=r"kind.*'locks'"):
        release_all(r, prefix="redislock", kind="locks")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="prefix"):
        release_all(r, prefix="")
    with pytest.raises(TypeError):
        release_all(r, "redislock")  # type: ignore[misc]


# -- one event, one log line -----------------------------------------------------------


@pytest.mark.parametrize("watched", [False, True])
def test_a_lost_lease_is_logged_once(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, watched: bool
) -> None:
    """The core logs a lost lease at WARNING only when nobody watches it: a lease with
    ``on_lost`` is reported by its owner (the Celery layer logs one ERROR)."""
    lost: list[Any] = []
    lock = RedisLock(r, "watched" if watched else "unwatched", ttl=0.3)
    caplog.set_level("DEBUG", logger="celery_redislock")
    lease = lock.acquire(renew=True, on_lost=lost.append if watched else None)
    assert lease is not None
    lock.force_release()
    assert lease.wait_lost(3)
    records = [rec for rec in caplog.records if "lost" in rec.getMessage()]
    assert len(records) == 1
    assert records[0].levelname == ("DEBUG" if watched else "WARNING")
    assert lost == ([lease] if watched else [])


def test_extend_add_on_a_renewed_lease_is_kept_by_renewal(
    primitive: RedisLock | RedisSemaphore,
) -> None:
    """Renewal goes on at the added length, not at the lease's first TTL."""
    r = primitive.client
    lease = primitive.acquire(ttl=0.6, renew=True)
    assert lease is not None
    assert lease.extend(5, add=True)
    time.sleep(1.5)  # several renewal ticks of the old 0.6 s TTL
    if isinstance(primitive, RedisLock):
        left = r.pttl(primitive.keys.holders)
    else:
        seconds, micros = r.time()
        left = r.zscore(primitive.keys.holders, lease.token) - seconds * 1000 - micros // 1000
    assert left > 3_000, left
    assert lease.held() and not lease.lost
    assert lease.release()
