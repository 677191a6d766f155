"""RedlockLock on five real redis-server masters: contract, bad input, fences, waiting."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock import ConfigurationError, LockNotOwned, RedisLock, RedlockLock
from celery_redislock.celery.redlock import CeleryRedlock
from celery_redislock.core.renewal import renewer
from celery_redislock.testing import RedisServer
from tests.faults import FaultProxy
from tests.topologies.redlock.conftest import GRACE, mark_booted

# Latency bounds (the slowest master, not the sum) and renewal timing.
pytestmark = pytest.mark.serial


def make(clients: list[redis.Redis], name: str = "job", **options: object) -> RedlockLock:
    options.setdefault("ttl", GRACE)
    return RedlockLock(clients, name, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [0, 1, 2, 4])
def test_too_few_or_an_even_number_of_masters_is_refused(
    clients: list[redis.Redis], count: int
) -> None:
    with pytest.raises(ConfigurationError, match=f"odd number of at least 3 masters.*got {count}"):
        RedlockLock(clients[:count], "job")


def test_two_clients_of_one_server_are_refused(masters: list[RedisServer]) -> None:
    port = masters[0].port
    same = [
        redis.Redis(port=port),
        redis.Redis(host="localhost", port=port, db=3),
        redis.Redis(port=masters[1].port),
    ]
    message = rf"clients\[0\] and clients\[1\].*127.0.0.1:{port}"
    with pytest.raises(ConfigurationError, match=message):
        RedlockLock(same, "job")


def test_bad_values_are_named(clients: list[redis.Redis]) -> None:
    with pytest.raises(ConfigurationError, match=r"clients must be a list.*'redis://x'"):
        RedlockLock("redis://x", "job")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"clients must be redis.Redis.*'nope'"):
        RedlockLock([*clients[:2], "nope"], "job")
    with pytest.raises(ConfigurationError, match=r"ttl must be <= max_ttl \(2\), got 5"):
        RedlockLock(clients[:3], "job", ttl=5, max_ttl=2)
    with pytest.raises(ConfigurationError, match=r"drift must be .* got 0.7"):
        RedlockLock(clients[:3], "job", drift=0.7)
    lock = make(clients[:3])
    with pytest.raises(ConfigurationError, match=r"ttl must be <= max_ttl .* got 60"):
        lock.acquire(ttl=60)


def test_contract_acquire_release_extend_with(clients: list[redis.Redis]) -> None:
    lock, other = make(clients), make(clients)
    lease = lock.acquire(blocking=False)
    assert lease is not None and not lease.lost
    assert other.acquire(blocking=False) is None
    assert lock.locked()
    assert lease.extend() and lease.remaining() > GRACE * 0.9
    assert lease.release() and not lease.lost
    assert not lock.locked()
    with other as second:
        assert second.fence > lease.fence
        views = other.info_by_master()
        assert len(views) == 5 and all(view.holders for view in views.values())  # type: ignore[union-attr]
    # A lease that expired is lost and never brought back; leaving `with` says so.
    with pytest.raises(LockNotOwned), lock as third:
        time.sleep(GRACE + 0.1)
    assert third.lost and not third.extend()


def test_each_master_keeps_the_lease_in_its_own_lock_keys(clients: list[redis.Redis]) -> None:
    lease = make(clients).acquire()
    assert lease is not None
    for client in clients:  # the single-server lock reads it: the same scripts, same keys
        info = RedisLock(client, "job").info()
        assert [holder.fence for holder in info.holders] == [lease.fence]
    lease.release()


def test_latency_is_the_slowest_master_not_the_sum(masters: list[RedisServer]) -> None:
    # Three of five masters behind a proxy adding 0.1 s each way: a round trip to each
    # costs 0.2 s; in sequence an acquire would take 0.6 s, in parallel 0.2 s.
    proxies = [FaultProxy("127.0.0.1", server.port).start() for server in masters[:3]]
    try:
        for proxy in proxies:
            proxy.delay = 0.1
        clients = [redis.Redis(port=proxy.port) for proxy in proxies]
        clients += [redis.Redis(port=server.port) for server in masters[3:]]
        lock = make(clients, ttl=3.0, max_ttl=3.0, master_timeout=1.0)
        # Connections made (handshakes at 0.2 s a round trip: this one runs out of
        # validity and gives back what it got), scripts loaded.
        warm = lock.acquire(blocking=False)
        if warm is not None:
            warm.release()
        wait_start = time.monotonic()
        lease = lock.acquire(blocking=False)
        took = time.monotonic() - wait_start
        assert lease is not None, "granted"
        assert 0.19 < took < 0.5, took  # in sequence: 0.6 s
    finally:
        for proxy in proxies:
            proxy.stop()


def test_try_acquire_adopt_and_release_owner(clients: list[redis.Redis]) -> None:
    lock = make(clients)
    queued, holder = lock.try_acquire(owner="task-1")
    assert queued is not None and holder is None
    refused, holder = make(clients).try_acquire(owner="task-2")
    assert refused is None and holder == "task-1"
    running = lock.adopt(queued.token, new_token="run-1", owner="task-1@run")
    assert running is not None and running.token == "run-1" and running.fence > queued.fence
    assert lock.adopt(queued.token) is None  # handed over already, on every master
    assert not queued.release()
    assert lock.release_owner("someone-else") == 0
    assert lock.release_owner("task-1@run") == 5
    assert not lock.locked()


def test_no_lease_outlives_max_ttl(clients: list[redis.Redis]) -> None:
    lease = make(clients).acquire(blocking=False)  # max_ttl defaults to the ttl
    assert lease is not None
    with pytest.raises(ConfigurationError, match="ttl must be <= max_ttl"):
        lease.extend(GRACE * 5)
    assert lease.extend(GRACE / 2) and lease.remaining() < GRACE / 2
    with pytest.raises(ConfigurationError, match="ttl must be <= max_ttl"):
        lease.hand_over(GRACE * 5)  # (a Celery singleton's lock cuts it to max_ttl instead)


def test_a_majority_granted_too_late_is_no_grant(
    masters: list[RedisServer],
) -> None:
    # Two of three masters answer after 0.4 s, a 0.3 s lease: they grant, but the
    # lease's validity is over before the majority's answers arrive.
    proxies = [FaultProxy("127.0.0.1", server.port).start() for server in masters[:2]]
    try:
        clients = [redis.Redis(port=proxy.port) for proxy in proxies]
        clients.append(redis.Redis(port=masters[2].port))
        lock = make(clients, ttl=0.3, master_timeout=2.0)
        warm = lock.acquire(blocking=False)  # connections made, scripts loaded
        assert warm is not None and warm.release()
        for proxy in proxies:
            proxy.delay = 0.2
        started = time.monotonic()
        assert lock.acquire(blocking=False) is None
        assert time.monotonic() - started >= 0.4  # it did wait for the majority's answers
        for proxy in proxies:
            proxy.delay = 0.0
        lease = make(clients, ttl=0.3).acquire(blocking=False)
        assert lease is not None and lease.release()
    finally:
        for proxy in proxies:
            proxy.stop()


def test_held_asks_the_masters_as_the_single_server_lease_does(
    clients: list[redis.Redis],
) -> None:
    # #30 item 6: RedlockLease.held() raised NotImplementedError.
    lock = make(clients)
    lease = lock.acquire(blocking=False)
    assert lease is not None
    assert lease.held() and not lease.lost
    assert 0 < lease.remaining() <= GRACE
    for client in clients[:2]:  # a minority forgets it: still held by a majority
        RedisLock(client, "job").force_release()
    assert lease.held() and not lease.lost
    RedisLock(clients[2], "job").force_release()  # now only two of five hold it
    assert not lease.held()
    assert lease.lost and "held()" in (lease.lost_reason or "")
    assert not lease.release()
    released = lock.acquire(blocking=False)
    assert released is not None and released.release()
    assert not released.held()  # a released lease answers False without asking


def test_renewed_leases_are_renewed_by_the_process_renewer_not_a_thread_each(
    clients: list[redis.Redis],
) -> None:
    # #30 item 2: Redlock ran a renewal thread per lease.
    threads = threading.active_count()
    tracked = renewer().tracked
    leases = [make(clients, f"job-{i}", renew=True).acquire(blocking=False) for i in range(5)]
    assert all(lease is not None for lease in leases)
    assert renewer().tracked == tracked + 5
    time.sleep(GRACE * 1.6)  # past the TTL: renewed on a majority
    for lease in leases:
        assert lease is not None and not lease.lost and lease.remaining() > 0, lease
        assert lease.held()
    # The scheduler and one sender for these masters at most, not one per lease.
    assert threading.active_count() <= threads + 2, threading.enumerate()
    for lease in leases:
        assert lease is not None and lease.release()
    assert renewer().tracked == tracked


def test_a_renewed_lease_a_majority_lost_is_reported_at_the_next_renewal(
    clients: list[redis.Redis],
) -> None:
    lost = threading.Event()
    lease = make(clients, renew=True).acquire(blocking=False, on_lost=lambda _: lost.set())
    assert lease is not None
    RedisLock(clients[0], "job").force_release()  # a minority: renewed by the others
    time.sleep(GRACE / 2)
    assert not lease.lost, lease.lost_reason
    for client in clients[1:3]:  # now three of five forgot it
        RedisLock(client, "job").force_release()
    assert lost.wait(GRACE / 2 + 0.2), "not reported by the next renewal (every TTL/3)"
    assert "no longer held" in (lease.lost_reason or ""), lease.lost_reason
    assert not lease.release()


def test_extend_add_adds_on_a_majority_within_max_ttl_and_a_majority_gone_is_lost_at_once(
    clients: list[redis.Redis],
) -> None:
    # extend(add=True) is the single-server lease's (one implementation, #30 item 2):
    # lock_extend_add.lua on every master, the least time left of a majority kept.
    lease = make(clients, ttl=GRACE / 2, max_ttl=GRACE).acquire(blocking=False)
    assert lease is not None
    before = lease.remaining()
    assert lease.extend(GRACE / 4, add=True)
    assert before + GRACE / 4 - 0.05 < lease.remaining() < before + GRACE / 4 + 0.02
    # Added on the masters' own time: small additions never shorten the lease (the
    # lease's own loop set every master to its local time left plus the addition,
    # less than the masters had: each call cut the drift allowance and the round's
    # time off, 20 calls about 0.2 s here).
    before = lease.remaining()
    for _ in range(20):
        assert lease.extend(0.001, add=True)
    assert lease.remaining() > before - 0.03, (before, lease.remaining())
    # Past max_ttl: refused before anything is sent, the lease untouched.
    ttl = lease.ttl
    with pytest.raises(ConfigurationError, match="ttl must be <= max_ttl"):
        lease.extend(GRACE, add=True)
    assert lease.ttl == ttl and not lease.lost
    # A lock that cuts a TTL to max_ttl instead (a Celery singleton's): no master keeps
    # the lease longer than max_ttl, its restart grace, though each master adds to
    # the time it has left itself (more than the lease knows locally).
    cut = CeleryRedlock(clients, "cut", ttl=GRACE / 2, max_ttl=GRACE)
    held = cut.acquire(blocking=False)
    assert held is not None and held.extend(GRACE, add=True)
    for client in clients:
        (holder,) = RedisLock(client, "cut").info().holders
        assert GRACE - 0.1 < holder.ttl_left <= GRACE
    assert held.remaining() <= GRACE
    # Fewer than a majority still hold it: lost at once, not at the deadline.
    for client in clients[:3]:
        RedisLock(client, "job").force_release()
    started = time.monotonic()
    assert not lease.extend(GRACE / 4, add=True)
    assert lease.lost and time.monotonic() - started < 0.2
    assert "no longer held" in lease.lost_reason, lease.lost_reason


def test_an_extend_a_majority_confirmed_too_late_is_no_confirmation(
    masters: list[RedisServer],
) -> None:
    # As for a grant (above): two of three masters answer after 0.4 s. They hold the
    # lease (2 s left) and set its TTL to 0.3 s as asked, but their confirmations come
    # after that validity ended, by the lease's local clock: the extend is no
    # confirmation -- False and lost, as a Redlock grant that comes too late is none
    # -- not True for a lease whose time left is already below zero.
    proxies = [FaultProxy("127.0.0.1", server.port).start() for server in masters[:2]]
    try:
        clients = [redis.Redis(port=proxy.port) for proxy in proxies]
        clients.append(redis.Redis(port=masters[2].port))
        mark_booted(clients, 3.0)
        lock = make(clients, ttl=2.0, max_ttl=3.0, master_timeout=2.0)
        lease = lock.acquire(blocking=False)
        assert lease is not None  # 2 s left on every master
        for proxy in proxies:
            proxy.delay = 0.2
        extended = lease.extend(0.3)
        left = lease.remaining()
        assert not extended, f"extend() True with {left:.3f} s left"
        assert lease.lost and not lease.held()
    finally:
        for proxy in proxies:
            proxy.stop()
