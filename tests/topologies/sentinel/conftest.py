"""One Sentinel deployment for the Sentinel tests (a primary, two replicas, three
Sentinels from ``redis-server``), healed after each test that breaks it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_redislock.testing_sentinel import SentinelGroup

FAST = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
"""Client timeouts for tests that kill servers (redis-py's default is 5 s)."""


@pytest.fixture(scope="package")
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as started:
        yield started


@pytest.fixture
def healed(group: SentinelGroup) -> Iterator[SentinelGroup]:
    """The group with every node running and replicating; restored after the test."""
    group.wait_stable()
    yield group
    group.heal()
