"""Five private redis-server processes on free ports: the independent Redlock masters.

They are started once per module and healed before each test: a master a test killed
is started again (empty), a stopped one continued, and every master has been up
longer than :data:`GRACE` (a restarted master refuses grants for that long) and is
flushed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from celery_redislock.testing import RedisServer

# The Celery apps and in-process workers of the integration tests (test_redlock_celery).
from tests.integration.conftest import locks, make_app, worker  # noqa: F401

GRACE = 1.0
"""The ``max_ttl`` the tests give their locks (seconds): the restart grace."""


def client_of(server: RedisServer) -> redis.Redis:
    """A client that gives up fast on a dead or stopped master."""
    return redis.Redis(
        host="127.0.0.1", port=server.port, socket_timeout=0.5, socket_connect_timeout=0.5
    )


def is_up(server: RedisServer) -> bool:
    return server.process is not None and server.process.poll() is None


def wait_uptime(servers: list[RedisServer], seconds: float) -> None:
    """Block until every server has been up for ``seconds``."""
    for server in servers:
        with client_of(server) as client:
            up = int(client.info("server")["uptime_in_seconds"])
            started = time.time() - up  # whole seconds, rounded down by Redis
            time.sleep(max(0.0, started + seconds + 1.0 - time.time()))


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    started = [RedisServer().start() for _ in range(5)]
    try:
        yield started
    finally:
        for server in started:
            if server.process is not None:
                os.kill(server.process.pid, signal.SIGCONT)
            server.stop()


@pytest.fixture
def masters(servers: list[RedisServer]) -> Iterator[list[RedisServer]]:
    """The five servers, healed, up longer than GRACE, flushed."""
    for server in servers:
        if server.process is not None and is_up(server):
            os.kill(server.process.pid, signal.SIGCONT)
        else:
            server.start()
    wait_uptime(servers, GRACE)
    for server in servers:
        with client_of(server) as client:
            client.flushall()
    yield servers


@pytest.fixture
def clients(masters: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    """A client per master (short socket timeouts), closed after the test."""
    made = [client_of(server) for server in masters]
    yield made
    for client in made:
        client.close()


def mark_booted(clients: list[redis.Redis], grace: float) -> None:
    """Mark each master as past a restart grace of ``grace`` seconds (its boot marker
    set, as after that much uptime): these test servers held no lease before."""
    for client in clients:
        run_id = client.info("server")["run_id"]
        client.set(f"redislock:redlock:boot:{run_id}:{round(grace * 1000)}", 1)
