"""Numbers at their limits (issue 13, item 7): every TTL and timeout is bounded to what
Redis and Lua 5.1 represent exactly; the largest accepted one works end to end."""

from __future__ import annotations

import pytest
import redis

from celery_redislock import ConfigurationError, RedisLock, RedisSemaphore
from celery_redislock.core.validate import MAX_SECONDS


@pytest.mark.parametrize("ttl", [9.3e15, 1e16, 1e306, MAX_SECONDS + 1])
def test_a_ttl_past_the_maximum_is_refused(r: redis.Redis, ttl: float) -> None:
    # Before: 9.3e15 s passed, the expiry became -2^63 in Lua, PEXPIREAT deleted the
    # key at once and a second acquire got a lease too; 1e306 raised OverflowError.
    for make in (
        lambda: RedisLock(r, "big", ttl=ttl),
        lambda: RedisSemaphore(r, "big", limit=1, ttl=ttl),
    ):
        with pytest.raises(ConfigurationError, match=r"ttl must be at most 1000000000"):
            make()
    lock = RedisLock(r, "big")
    with pytest.raises(ConfigurationError, match="ttl"):
        lock.acquire(ttl=ttl)
    with pytest.raises(ConfigurationError, match="timeout"):
        lock.acquire(timeout=ttl)


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_the_maximum_holds_and_extend_past_it_changes_nothing(r: redis.Redis, kind: str) -> None:
    primitive = (
        RedisLock(r, "big", ttl=MAX_SECONDS)
        if kind == "lock"
        else RedisSemaphore(r, "big", limit=1, ttl=MAX_SECONDS)
    )
    lease = primitive.acquire(blocking=False)
    assert lease is not None
    assert primitive.acquire(blocking=False) is None  # still exclusive
    [holder] = primitive.info().holders
    assert MAX_SECONDS - 60 < holder.ttl_left <= MAX_SECONDS
    assert r.pttl(primitive.keys.holders) > (MAX_SECONDS - 60) * 1000
    with pytest.raises(ConfigurationError, match="ttl"):
        lease.extend(1e16)  # before: the lock vanished
    assert primitive.acquire(blocking=False) is None
    assert lease.extend(MAX_SECONDS) and lease.release()
