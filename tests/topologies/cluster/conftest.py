"""A real Redis Cluster (3 primaries + 3 replicas from ``redis-server``), started once
per test session by :class:`celery_redislock.testing_cluster.LocalCluster`.

Tests share it: each uses names of its own, and a test that kills or moves something
leaves the cluster healthy again (every node running, every slot served).
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from celery_redislock.core.scripts import LuaScript
from celery_redislock.testing_cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """The session's cluster."""
    with LocalCluster() as local:
        yield local


@pytest.fixture
def rc(cluster: LocalCluster) -> Iterator[RedisCluster]:
    """A cluster client of the test's own (short timeouts: nodes get killed)."""
    cluster.wait_healthy()
    client = cluster.client(socket_timeout=2, socket_connect_timeout=1)
    yield client
    client.close()


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[tuple[int, str]]:
    """Script calls made during the test, by (id(client), script name)."""
    counter: collections.Counter[tuple[int, str]] = collections.Counter()
    call = LuaScript.__call__

    def counting(
        self: LuaScript, client: Any, keys: list[Any], args: list[Any], **options: Any
    ) -> Any:
        counter[id(client), self.name] += 1
        return call(self, client, keys, args, **options)

    monkeypatch.setattr(LuaScript, "__call__", counting)
    return counter


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the scripts that ran on a cluster client during the test."""
    names: set[str] = set()
    call = LuaScript.__call__

    def recording(
        self: LuaScript, client: Any, keys: list[Any], args: list[Any], **options: Any
    ) -> Any:
        if isinstance(client, RedisCluster):
            names.add(self.name)
        return call(self, client, keys, args, **options)

    monkeypatch.setattr(LuaScript, "__call__", recording)
    return names
