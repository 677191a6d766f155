"""A master that closed a Redlock client's idle connection (its ``timeout`` setting,
``CLIENT KILL``, a proxy dropping idle connections) is still a master that answers:
the next round connects again instead of counting it as down, as redis-py's pool
does for the single-server lock."""

from __future__ import annotations

import redis

from celery_redislock import RedisLock, RedlockLock
from celery_redislock.testing import RedisServer
from tests.topologies.redlock.conftest import GRACE


def _close_idle_connections(server: RedisServer) -> None:
    with redis.Redis(port=server.port) as admin:
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


def test_connections_closed_by_every_master_cost_no_acquire(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = RedlockLock(clients, "job", ttl=GRACE)
    single = RedisLock(clients[0], "single", ttl=GRACE)
    for _ in range(3):
        for held in (lock.acquire(blocking=False), single.acquire(blocking=False)):
            assert held is not None and held.release()
        for server in masters:  # idle: every connection closed by its server
            _close_idle_connections(server)


def test_a_closed_connection_on_a_live_master_beside_a_stopped_minority(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = RedlockLock(clients[:3], "job", ttl=GRACE)
    held = lock.acquire(blocking=False)
    assert held is not None and held.release()
    masters[0].stop()
    held = lock.acquire(blocking=False)  # a majority, masters 1 and 2
    assert held is not None and held.release()
    _close_idle_connections(masters[1])
    held = lock.acquire(blocking=False)
    assert held is not None, "a majority answers: masters 1 (reconnected) and 2"
    assert held.release()
