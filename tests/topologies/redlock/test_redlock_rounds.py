"""A Redlock round ends once a majority answered: the other masters' replies are read
later on the same connections, in order, each checked against its own call."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis

from celery_redislock import RedisLock, RedlockLock
from celery_redislock.core.redlock.wait import SPLIT_RETRIES
from celery_redislock.testing import RedisServer
from tests.topologies.redlock.conftest import GRACE

HOLDERS = "redislock:lock:{job}:holders"


def make(clients: list[redis.Redis], **options: object) -> RedlockLock:
    options.setdefault("ttl", GRACE)
    return RedlockLock(clients, "job", **options)  # type: ignore[arg-type]


def wait_free(clients: list[redis.Redis]) -> None:
    """Until no master holds the lock (a master's late requests run when it gets to
    them): a lease left behind on one would be a release lost."""
    deadline = time.monotonic() + 3.0
    while any(client.exists(HOLDERS) for client in clients):
        assert time.monotonic() < deadline, [client.hgetall(HOLDERS) for client in clients]
        time.sleep(0.01)


def test_a_stopped_minority_costs_a_round_nothing_and_catches_up_in_order(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = make(clients, master_timeout=2.0)
    warm = lock.acquire(blocking=False)  # connections made, scripts loaded
    assert warm is not None and warm.release()
    stopped = lock._masters[4]
    connection = stopped._idle[-1]
    assert masters[4].process is not None
    os.kill(masters[4].process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        lease = lock.acquire(blocking=False)
        assert lease is not None and lease.release()
        assert time.monotonic() - started < 1.0  # not its 2 s master_timeout
    finally:
        os.kill(masters[4].process.pid, signal.SIGCONT)
    # Resumed, it runs the acquire, then the release; the next rounds read their
    # replies on the same connection (a reply out of order would have closed it).
    for _ in range(3):
        again = lock.acquire(blocking=False)
        assert again is not None and again.fence > lease.fence and again.release()
    assert stopped._idle == [connection] and connection._sock is not None
    wait_free(clients)


def test_scripts_flushed_between_rounds_are_sent_again(clients: list[redis.Redis]) -> None:
    lock = make(clients)
    fences = []
    for _ in range(4):
        for client in clients:
            client.script_flush()
        lease = lock.acquire(blocking=False)
        assert lease is not None and lease.release()
        fences.append(lease.fence)
    assert fences == sorted(set(fences))
    wait_free(clients)


def test_a_split_keeps_its_grants_while_it_asks_again(clients: list[redis.Redis]) -> None:
    # Four masters held by a stranger, the first free: every round grants on the first
    # master only. The waiter keeps that grant for SPLIT_RETRIES rounds (a release on
    # its way to the others would make them a majority), then gives it back.
    strangers = [RedisLock(client, "job", ttl=5).acquire(blocking=False) for client in clients[1:]]
    assert all(strangers)
    lock = make(clients)
    give_backs: list[bool] = []
    attempt = lock._try

    def recorded(*args: Any) -> Any:
        give_backs.append(args[4])
        return attempt(*args)

    lock._try = recorded  # type: ignore[method-assign]
    assert lock.acquire(timeout=0.3) is None
    assert give_backs[:SPLIT_RETRIES + 1] == [False] * SPLIT_RETRIES + [True], give_backs
    assert not clients[0].exists(HOLDERS)  # given back when the wait ended
