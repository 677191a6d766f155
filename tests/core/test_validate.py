"""Bad input to the core lock fails at once, naming the argument and the value (no Redis).

The client below points at a port nothing listens on: every check must happen before
any command is sent, or these tests fail with a connection error instead.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_redislock import (
    ConfigurationError,
    DuplicateTask,
    Lease,
    LockNotOwned,
    RedisLock,
    RedisLockError,
)
from celery_redislock.core.validate import ttl_to_ms


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    yield c
    c.close()


def assert_names(
    error: pytest.ExceptionInfo[ConfigurationError], argument: str, value: Any
) -> None:
    message = str(error.value)
    assert argument in message
    assert repr(value) in message
    assert isinstance(error.value, ValueError)
    assert isinstance(error.value, RedisLockError)


BAD_TTLS = [0, 0.0, -1, -0.001, math.nan, math.inf, -math.inf, "1", None, True, False, [1], b"1"]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_bad_ttl_refused_at_construction(client: redis.Redis, ttl: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(client, "name", ttl=ttl)
    assert_names(error, "ttl", ttl)


@pytest.mark.parametrize("ttl", [v for v in BAD_TTLS if v is not None], ids=repr)
def test_bad_ttl_refused_by_acquire(client: redis.Redis, ttl: Any) -> None:
    lock = RedisLock(client, "name")  # acquire(ttl=None) means "the lock's ttl"
    with pytest.raises(ConfigurationError) as error:
        lock.acquire(ttl=ttl)
    assert_names(error, "ttl", ttl)


@pytest.mark.parametrize("ttl", [v for v in BAD_TTLS if v is not None], ids=repr)
def test_bad_ttl_refused_by_extend(client: redis.Redis, ttl: Any) -> None:
    lease = Lease(RedisLock(client, "name"), "0" * 32, 1, 30.0)
    with pytest.raises(ConfigurationError) as error:
        lease.extend(ttl)
    assert_names(error, "ttl", ttl)


@pytest.mark.parametrize("ttl", [0.001, 0.05, 1, 2.5, 86400 * 365])
def test_good_ttl_accepted_with_millisecond_precision(client: redis.Redis, ttl: float) -> None:
    lock = RedisLock(client, "name", ttl=ttl)
    assert lock.ttl == pytest.approx(ttl, abs=0.0005)
    assert ttl_to_ms(ttl) == round(ttl * 1000)


def test_sub_millisecond_ttl_rounds_up_to_one_millisecond() -> None:
    assert ttl_to_ms(0.0001) == 1


@pytest.mark.parametrize("name", ["", None, 1, b"name", ["name"]], ids=repr)
def test_bad_name_refused(client: redis.Redis, name: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(client, name)
    assert_names(error, "name", name)


@pytest.mark.parametrize(
    "bad_client",
    [None, "redis://127.0.0.1:6379/0", object(), redis.ConnectionPool(port=1), 42],
    ids=["None", "url", "object", "pool", "int"],
)
def test_non_redis_client_refused(bad_client: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(bad_client, "name")
    assert_names(error, "client", bad_client)


@pytest.mark.parametrize("timeout", [-1, -0.001, math.nan, "1", True, [1]], ids=repr)
def test_bad_timeout_refused(client: redis.Redis, timeout: Any) -> None:
    lock = RedisLock(client, "name")
    with pytest.raises(ConfigurationError) as error:
        lock.acquire(timeout=timeout)
    assert_names(error, "timeout", timeout)


@pytest.mark.parametrize("owner", ["", 1, b"owner", ["o"]], ids=repr)
def test_bad_owner_refused(client: redis.Redis, owner: Any) -> None:
    lock = RedisLock(client, "name")
    with pytest.raises(ConfigurationError) as error:
        lock.acquire(owner=owner)
    assert_names(error, "owner", owner)


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", None], ids=repr)
def test_bad_prefix_refused(client: redis.Redis, prefix: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(client, "name", prefix=prefix)
    assert "prefix" in str(error.value)


@pytest.mark.parametrize("renew", [1, "yes", None], ids=repr)
def test_bad_renew_refused(client: redis.Redis, renew: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(client, "name", renew=renew)
    assert_names(error, "renew", renew)


# -- errors ---------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    for cls in (ConfigurationError, LockNotOwned, DuplicateTask):
        assert issubclass(cls, RedisLockError)
    assert issubclass(ConfigurationError, ValueError)
    assert not issubclass(LockNotOwned, ValueError)


def test_lock_not_owned_pickles_with_its_attributes() -> None:
    error = LockNotOwned("lease on 'n' was lost", "n", "ab" * 16)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is LockNotOwned
    assert (copy.name, copy.token, str(copy)) == ("n", "ab" * 16, "lease on 'n' was lost")
    assert copy.args == error.args


def test_duplicate_task_pickles_with_its_attributes() -> None:
    error = DuplicateTask("already queued", "task-id-1", "redislock:lock:{x}:holders")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is DuplicateTask
    assert (copy.task_id, copy.key, str(copy)) == (
        "task-id-1",
        "redislock:lock:{x}:holders",
        "already queued",
    )


def test_configuration_error_pickles() -> None:
    error = ConfigurationError("ttl must be a finite number of seconds > 0, got -1")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ConfigurationError
    assert str(copy) == str(error)
    assert isinstance(copy, ValueError)


def test_real_configuration_error_pickles(client: redis.Redis) -> None:
    with pytest.raises(ConfigurationError) as error:
        RedisLock(client, "name", ttl=-1)
    copy = pickle.loads(pickle.dumps(error.value))
    assert str(copy) == str(error.value)
