"""How long a consumed park token is remembered (``taken_memory``): a second message of
the entry arriving within it is a duplicate. It must outlast a broker's redelivery (a
Redis broker restores an unacknowledged message after ``visibility_timeout``)."""

from __future__ import annotations

import pytest
import redis

from celery_redislock.core.parking import DUPLICATE, TAKEN, TAKEN_MEMORY_MS, new_entry_id
from celery_redislock.errors import ConfigurationError

from .test_parking import _pool


def _taken(r: redis.Redis, memory: float | None) -> tuple[str, float]:
    """Park, claim and take an entry; its id and how long (s) it is remembered."""
    sem, _ = _pool(r) if memory is None else _pool(r, taken_memory=memory)
    entry = new_entry_id()
    assert sem.park(entry, b"x") == 0  # claimed at once: the permit was free
    status, lease = sem.take(entry, "t0")
    assert status == TAKEN and lease is not None
    lease.release()
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    return entry, (float(r.zscore(sem.taken_key, entry) or 0) - now_ms) / 1000


def test_a_taken_token_is_remembered_as_long_as_asked(r: redis.Redis) -> None:
    entry, left = _taken(r, 7200.0)
    assert 7190 < left <= 7200
    sem, _ = _pool(r, taken_memory=7200.0)
    assert sem.take(entry, "t1")[0] == DUPLICATE
    assert r.pttl(sem.taken_key) > 7_190_000


def test_the_default_memory_and_a_shorter_one_do_not_cut_a_longer_one(r: redis.Redis) -> None:
    _, left = _taken(r, None)
    assert TAKEN_MEMORY_MS / 1000 - 10 < left <= TAKEN_MEMORY_MS / 1000
    sem, _ = _pool(r, taken_memory=7200.0)
    _taken(r, 7200.0)
    _taken(r, 60.0)  # another app's shorter memory: the key keeps the longer TTL
    assert r.pttl(sem.taken_key) > 7_190_000


def test_a_memory_that_is_not_a_positive_duration_is_refused(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="taken_memory"):
        _pool(r, taken_memory=0)
