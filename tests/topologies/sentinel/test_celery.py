"""Celery through Sentinel: the default follows a Sentinel broker (with the broker's
transport options), a Redis result backend beside a non-Redis broker, and
``redislock_url`` in Sentinel form; singleton runs take their lock on the primary."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redislock import ConfigurationError, NotReplicated, SingletonTask
from celery_redislock.celery.client import get_redis, replica_options
from celery_redislock.testing_sentinel import SentinelGroup


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("sentinel-celery", set_as_current=False)
    app.conf.task_always_eager = True  # the full lock path, without a worker
    yield app
    app.close()


def _run_singleton(app: Celery, group: SentinelGroup) -> list[int]:
    """Run a singleton task; return how many copies of its lock the nodes held."""
    seen: list[int] = []

    @app.task(base=SingletonTask, shared=False)
    def job(n: int) -> int:
        client = get_redis(app)
        keys = client.keys("redislock:lock:*:holders")
        assert len(keys) == 1
        for port in group.nodes:  # the lock was written on the primary and replicated
            node = group.node_client(port)
            try:
                seen.append(int(node.exists(keys[0])))
            finally:
                node.close()
        return n * 2

    assert job.delay(21).get() == 42
    assert get_redis(app).keys("redislock:lock:*:holders") == []  # released
    return seen


def _sentinel_pool(app: Celery) -> Any:
    return get_redis(app).connection_pool


def test_default_follows_a_sentinel_broker(app: Celery, group: SentinelGroup) -> None:
    group.wait_stable()
    app.conf.update(
        broker_url=group.url, broker_transport_options={"master_name": group.master_name}
    )
    assert _sentinel_pool(app).service_name == group.master_name
    seen = _run_singleton(app, group)
    assert sum(seen) >= 1  # on the primary at least (replication is asynchronous)


def test_redis_backend_beside_a_non_redis_broker(app: Celery, group: SentinelGroup) -> None:
    # A RabbitMQ broker would do the same (it is never contacted here); memory:// needs
    # no server. The locks go to the result backend's Sentinel-managed primary.
    options = {"master_name": group.master_name}
    app.conf.update(
        broker_url="memory://", result_backend=group.url, result_backend_transport_options=options
    )
    assert get_redis(app).ping()
    assert _sentinel_pool(app).service_name == group.master_name


def test_explicit_sentinel_url_with_min_replicas(app: Celery, group: SentinelGroup) -> None:
    group.wait_stable()
    app.conf.update(
        broker_url="memory://",
        redislock_url=group.url,
        redislock_transport_options={"master_name": group.master_name},
        redislock_min_replicas=2,
        redislock_replica_timeout=0.5,
    )
    assert _run_singleton(app, group) == [1, 1, 1]  # acknowledged by both replicas

    app.conf.redislock_min_replicas = 3  # more than there are

    @app.task(base=SingletonTask, shared=False)
    def never(n: int) -> int:
        raise AssertionError("ran without a trusted lock")

    with pytest.raises(NotReplicated, match="min_replicas=3"):
        never.delay(1)
    assert get_redis(app).keys("redislock:lock:*:holders") == []  # released


def test_bad_replica_settings_are_named(app: Celery, group: SentinelGroup) -> None:
    app.conf.update(
        broker_url="memory://",
        redislock_url=group.url,
        redislock_transport_options={"master_name": group.master_name},
    )
    for key, value in (
        ("redislock_min_replicas", -1),
        ("redislock_replica_timeout", 0),
        ("redislock_wait_aof", "no"),
    ):
        app.conf[key] = value
        with pytest.raises(ConfigurationError, match=key):
            replica_options(app)
        app.conf[key] = {
            "redislock_min_replicas": 1,
            "redislock_replica_timeout": 1.0,
            "redislock_wait_aof": False,
        }[key]
    assert replica_options(app) == {"min_replicas": 1, "replica_timeout": 1.0, "wait_aof": False}
