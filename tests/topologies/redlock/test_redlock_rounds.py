"""A Redlock round ends once a majority answered: the other masters' replies are read
later on the same connections, in order, each checked against its own call."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import redis

from celery_redislock import RedisLock, RedlockLock
from celery_redislock.core.redlock import rounds
from celery_redislock.core.redlock.fanout import MAX_DUE
from celery_redislock.core.redlock.masters import RECONNECT_MAX
from celery_redislock.core.redlock.wait import SPLIT_RETRIES
from celery_redislock.testing import RedisServer
from tests.faults import FaultProxy
from tests.topologies.redlock.conftest import GRACE, mark_booted

# Bounds on how long a round takes beside a stopped master.
pytestmark = pytest.mark.serial

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
    link = stopped._idle[-1]
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
    assert stopped._idle == [link] and link.connected
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
    assert give_backs[: SPLIT_RETRIES + 1] == [False] * SPLIT_RETRIES + [True], give_backs
    assert not clients[0].exists(HOLDERS)  # given back when the wait ended


def test_a_master_that_is_down_is_tried_again_after_a_backoff_not_every_round(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = make(clients)
    warm = lock.acquire(blocking=False)  # connections made
    assert warm is not None and warm.release()
    masters[0].stop()

    def probe() -> tuple[Any, float]:
        start = time.monotonic()
        outcome = rounds.attempt(
            lock._masters,
            lock._acquire_call("probe", [1000, "", b"0", 0, round(GRACE * 1000)]),
            1000,
            1.0,
        )
        took = time.monotonic() - start
        lock._release_token("probe")
        assert len(outcome.grants) >= lock.quorum, outcome
        return outcome.errors.get(0), took

    # The old connection fails first, then a connect is refused: from then on the
    # master is skipped (no connect) until its backoff ends.
    deadline = time.monotonic() + 3.0
    while "backoff" not in str(probe()[0]):
        assert time.monotonic() < deadline
    error, took = probe()
    assert "backoff" in str(error) and took < 0.5, (error, took)
    masters[0].start()
    mark_booted([clients[0]], GRACE)
    deadline = time.monotonic() + RECONNECT_MAX + 2.0
    while probe()[0] is not None:  # back in use once its backoff is over
        assert time.monotonic() < deadline, "the master was not reconnected"
        time.sleep(0.01)


def test_masters_that_were_slow_catch_up_and_answer_when_a_round_needs_them(
    masters: list[RedisServer],
) -> None:
    # A burst of acquires outruns two slow masters: each round ends once the three
    # fast ones granted, so the slow ones owe a reply more each round and, owing
    # MAX_DUE, are sent nothing (the last leases are on the three fast masters only).
    # Then two of those three turn slow: held() of such a lease gets a live answer
    # from one master and "not held" from the two that never had it -- it needs the
    # slow ones, which must catch up (their owed replies read as they arrive) and be
    # asked, not be counted as not answering (RedlockUnavailable, "answers from 3 of
    # 5, 3 needed": the serial run's failure of the renewal test).
    proxies = [FaultProxy("127.0.0.1", server.port).start() for server in masters]
    try:
        clients = [redis.Redis(port=proxy.port) for proxy in proxies]
        mark_booted(clients, 5.0)
        locks = [
            RedlockLock(clients, f"job-{i}", ttl=5.0, master_timeout=3.0)  # type: ignore[arg-type]
            for i in range(MAX_DUE + 2)
        ]
        warm = locks[0].acquire(blocking=False)  # connections made, scripts loaded
        assert warm is not None and warm.release()
        for proxy in proxies[3:]:
            proxy.delay = 0.2
        leases = [lock.acquire(blocking=False) for lock in locks]
        assert all(lease is not None for lease in leases)
        for proxy in proxies[3:]:
            proxy.delay = 0.0
        for proxy in proxies[:2]:
            proxy.delay = 0.1
        time.sleep(0.5)  # the slow masters' replies are in (not read yet)
        last = f"redislock:lock:{{job-{MAX_DUE + 1}}}:holders"
        assert [client.exists(last) for client in clients] == [1, 1, 1, 0, 0]
        for lease in leases:
            assert lease is not None and lease.held() > 0, lease
        for lease in leases:
            assert lease is not None and lease.release()
    finally:
        for proxy in proxies:
            proxy.stop()
