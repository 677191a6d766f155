"""Constructing a lock is cheap (issue 13, item 11): what does not depend on the name
is made once per prefix (its check), and only the uncontended path's key lists are
built; benchmarks/bench_lock.py measures the cycle
with an object built per acquire."""

from __future__ import annotations

import pytest
import redis

from celery_redislock import ConfigurationError, RedisLock


@pytest.mark.parametrize("name", ["user:42", "a{b}c%d", "ünïcode"])
def test_keys_are_what_redis_py_would_send(r: redis.Redis, name: str) -> None:
    lock = RedisLock(r, name)
    encode = r.get_encoder().encode
    keys = lock.keys
    scripts = lock._scripts
    assert scripts.acquire_keys == [
        encode(k) for k in (keys.holders, keys.fence, keys.queue, keys.alive, keys.asks)
    ]
    assert scripts.queue_keys == [
        encode(k) for k in (keys.holders, keys.queue, keys.alive, keys.asks)
    ]
    assert scripts.release_call("t") == [*scripts.release_keys, encode(keys.done("t"))]
    assert scripts.add_keys == [encode(keys.holders), encode(keys.added)]


def test_a_bad_prefix_is_refused_every_time(r: redis.Redis) -> None:
    for _ in range(2):  # the check is cached per prefix, the refusal too
        with pytest.raises(ConfigurationError, match="prefix"):
            RedisLock(r, "x", prefix="a{b}")
    with pytest.raises(ConfigurationError, match="prefix"):
        RedisLock(r, "x", prefix=["not", "hashable"])  # type: ignore[arg-type]
