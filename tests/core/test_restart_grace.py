"""Restart grace (core/restart.py): a semaphore's limit holds when its Redis restarts
empty while renewing holders run -- they get their permits back, newcomers wait.

Each test runs a redis-server of its own, SIGKILLs it and starts an empty one on the
same port (no AOF, no RDB), as a crash without persistence does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core.lease import Lease
from celery_redislock.core.renewal.entry import Entry
from celery_redislock.core.renewal.sender import batch_call
from celery_redislock.errors import ConfigurationError, RedisRestarting
from celery_redislock.testing import RedisServer

from ..integration.helpers import wait_until

TTL = 1.5


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=0.5)


def _real_holders(sem: RedisSemaphore) -> set[str]:
    """Token hints of the live permits, placeholders ("~restart:<i>") left out."""
    return {h.token_hint for h in sem.info().holders if not h.token_hint.startswith("~restart")}


def _holders_and_restart(
    server: RedisServer, grace: bool | None
) -> tuple[RedisSemaphore, list[Lease], RedisSemaphore]:
    holder = RedisSemaphore(_client(server), "pool", limit=2, ttl=TTL, restart_grace=grace)
    leases = [holder.acquire(blocking=False, renew=True) for _ in range(2)]
    assert all(lease is not None for lease in leases)
    newcomer = RedisSemaphore(_client(server), "pool", limit=2, ttl=TTL, restart_grace=grace)
    assert newcomer.acquire(blocking=False) is None  # the marker is set: a client's first call
    server.restart()  # SIGKILL, then an empty server on the same port
    return holder, [lease for lease in leases if lease is not None], newcomer


def test_renewing_holders_keep_their_permits_and_newcomers_wait(server: RedisServer) -> None:
    holder, leases, newcomer = _holders_and_restart(server, True)
    # Until the grace (the TTL) ends, and after it while both holders renew, no third
    # permit: the restarted server sees placeholders, then the holders put back.
    deadline = time.monotonic() + 2.5 * TTL
    while time.monotonic() < deadline:
        extra = newcomer.acquire(blocking=False)
        assert extra is None, "a third permit beside two live holders"
        time.sleep(0.05)
    assert not any(lease.lost for lease in leases), [lease.lost_reason for lease in leases]
    assert _real_holders(holder) == {lease.token[:8] for lease in leases}
    fences = {h.fence for h in holder.info().holders}
    assert fences == {lease.fence for lease in leases}, "put back with their own fences"
    assert leases[0].release()
    third = newcomer.acquire(timeout=2 * TTL)
    assert third is not None, "the permit a holder gave back goes to the newcomer"
    assert third.release() and leases[1].release()


def test_without_a_grace_the_restart_lets_a_third_in(server: RedisServer) -> None:
    """The gap the grace closes: the same restart without it over-grants."""
    _, leases, newcomer = _holders_and_restart(server, None)
    wait_until(
        lambda: newcomer.acquire(blocking=False) is not None,
        timeout=5,
        what="a third permit while both holders run",
    )
    assert all(lease.lost_event.wait(3 * TTL) for lease in leases)


def test_a_lease_taken_away_or_expired_is_still_lost(server: RedisServer) -> None:
    client = _client(server)
    sem = RedisSemaphore(client, "pool", limit=2, ttl=TTL, restart_grace=True)
    lease = sem.acquire(blocking=False, renew=True)
    assert lease is not None
    assert sem.force_release() == 1  # the marker is older than its fence: not put back
    assert lease.lost_event.wait(2 * TTL)
    assert "no longer held" in lease.lost_reason
    assert sem.info().holders == []
    short = RedisSemaphore(client, "pool", limit=2, ttl=0.2, restart_grace=True)
    expired = short.acquire(blocking=False)
    assert expired is not None
    time.sleep(0.4)  # expired on the server; a renewal sent now must not revive it
    keys, args = batch_call([(Entry(expired, short, lambda _: None, None), 1000)])
    assert list(short._renew_script(client, keys, args)) == [0]
    assert short.info().holders == []


def test_restart_grace_is_validated(server: RedisServer) -> None:
    client = _client(server)
    # Below MIN_GRACE (2 s) too: a renewal after an outage may come that late, and a
    # grace of 0.001 s made renewal spin (~800 renewals a second for one lease).
    for bad in (0, -1.0, "30", float("nan"), 0.001, 1.5):
        with pytest.raises(ConfigurationError, match=f"restart_grace .*got {bad!r}"):
            RedisSemaphore(client, "pool", limit=1, restart_grace=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=f"restart_grace .*got {bad!r}"):
            RedisLock(client, "lock", restart_grace=bad)  # type: ignore[arg-type]
    for good in (2, 2.5):
        RedisSemaphore(client, "pool", limit=1, restart_grace=good)
        RedisLock(client, "lock", restart_grace=good)


def test_a_flush_past_the_grace_does_not_put_a_lease_back_over_the_limit(
    server: RedisServer,
) -> None:
    """FLUSHALL (or an evicted marker) on a server older than the grace: no grace is
    declared, so newcomers get the permits at once -- a lost lease's renewal must not
    then put it back beside them (limit 1, two holders)."""
    client = _client(server)
    sem = RedisSemaphore(client, "pool", limit=1, ttl=TTL, restart_grace=True)
    old = sem.acquire(blocking=False, renew=True)
    assert old is not None
    wait_until(
        lambda: int(client.info("server")["uptime_in_seconds"]) * 1000 > 2 * TTL * 1000,
        timeout=10,
        what="a server older than the grace",
    )
    client.flushall()
    newcomer = RedisSemaphore(_client(server), "pool", limit=1, ttl=TTL, restart_grace=True)
    new = newcomer.acquire(blocking=False, renew=True)
    assert new is not None, "no grace past the server's first TTL: the permit is free"
    assert old.lost_event.wait(2 * TTL), "the flushed lease put back beside the newcomer's"
    assert _real_holders(sem) == {new.token[:8]}
    assert new.release()


def test_a_lease_longer_than_the_grace_is_renewed_within_it(server: RedisServer) -> None:
    """A lease of 8x the grace (renewed every third of its own TTL it would first
    renew ~4 s after the restart, long after the 1.5 s grace): renewed on the grace's
    cadence, it is put back before newcomers get in."""
    holder = RedisSemaphore(_client(server), "pool", limit=1, ttl=TTL, restart_grace=True)
    newcomer = RedisSemaphore(_client(server), "pool", limit=1, ttl=TTL, restart_grace=True)
    lease = holder.acquire(blocking=False, renew=True, ttl=8 * TTL)
    assert lease is not None
    assert newcomer.acquire(blocking=False) is None  # the marker is set
    server.restart()
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline:
        assert newcomer.acquire(blocking=False) is None, "a permit beside the live holder"
        time.sleep(0.05)
    assert not lease.lost, lease.lost_reason
    assert lease.release()


def test_put_backs_before_any_acquire_stay_within_the_limit(server: RedisServer) -> None:
    """Renewals that reach a restarted server before any acquire put back no more
    leases than the limit: a lease released by force just before the restart (its
    renewal not yet told) and the newcomer that took its permit both renew -- one
    permit at limit 1, not two."""
    client = _client(server)
    sem = RedisSemaphore(client, "pool", limit=1, ttl=TTL, restart_grace=True)
    forced = sem.acquire(blocking=False)
    assert forced is not None
    assert sem.force_release() == 1
    taker = sem.acquire(blocking=False)
    assert taker is not None
    server.restart()
    answers = []
    for lease in (forced, taker):  # the renewals that were due, in either order
        keys, args = batch_call([(Entry(lease, sem, lambda _: None, None), 1500)])
        answers += list(sem._renew_script(_client(server), keys, args))
    assert answers.count(3) == 1, answers
    assert len(_real_holders(sem)) == 1


def _lock_and_restart(
    server: RedisServer, grace: bool | None
) -> tuple[RedisLock, Lease, RedisLock]:
    lock = RedisLock(_client(server), "job", ttl=TTL, restart_grace=grace)
    lease = lock.acquire(blocking=False, owner="first", renew=True)
    assert lease is not None
    other = RedisLock(_client(server), "job", ttl=TTL, restart_grace=grace)
    assert other.try_acquire(owner="second") == (None, "first")  # marks the server too
    server.restart()
    return lock, lease, other


def test_a_renewing_lock_holder_keeps_its_lock_and_nobody_else_takes_it(
    server: RedisServer,
) -> None:
    lock, lease, other = _lock_and_restart(server, True)
    refusals = set()
    deadline = time.monotonic() + 2.5 * TTL
    while time.monotonic() < deadline:
        try:  # in the grace and free: unknown; once put back: held by its owner
            granted, holder = other.try_acquire(owner="second")
        except RedisRestarting:
            refusals.add("restarting")
        else:
            assert granted is None, "a second holder beside a live one"
            refusals.add(holder)
        time.sleep(0.05)
    assert refusals >= {"first"} and not lease.lost, lease.lost_reason
    info = lock.info()
    assert [(h.owner, h.fence) for h in info.holders] == [("first", lease.fence)]
    assert lease.release()
    second = other.acquire(timeout=2 * TTL, owner="second")
    assert second is not None and second.fence > lease.fence and second.release()


def test_without_a_grace_a_second_lock_holder_gets_in(server: RedisServer) -> None:
    _, lease, other = _lock_and_restart(server, None)
    wait_until(
        lambda: other.try_acquire(owner="second")[0] is not None,
        timeout=5,
        what="a second holder while the first runs",
    )
    assert lease.lost_event.wait(3 * TTL)


def test_a_lock_lease_released_by_force_is_still_lost(server: RedisServer) -> None:
    lock = RedisLock(_client(server), "job", ttl=TTL, restart_grace=True)
    lease = lock.acquire(blocking=False, renew=True)
    assert lease is not None
    assert lock.force_release()
    assert lease.lost_event.wait(2 * TTL) and "no longer held" in lease.lost_reason


def test_a_lock_refuses_for_the_whole_grace_measured_from_the_restart(
    server: RedisServer,
) -> None:
    # INFO's uptime_in_seconds is two rounded-down wall clock seconds apart: it reads 1
    # as early as a few ms after the start. Taken as the server's age, the grace ended
    # up to a second early, while a forgotten lease could still run.
    grace = 2.0
    lock = RedisLock(_client(server), "job", ttl=TTL, restart_grace=grace)
    assert lock.try_acquire(owner="first")[0] is not None  # the marker is set
    # Started late in a wall clock second, the server's uptime reads 1 within ms; the
    # first call after the restart (which measures the grace) comes after that.
    time.sleep(0.85 - time.time() % 1 if time.time() % 1 < 0.85 else 1.85 - time.time() % 1)
    started = time.monotonic()  # before the new process starts: its age is less
    server.restart()
    time.sleep(0.3)
    probes = 0
    while time.monotonic() < started + grace * 0.95:
        try:
            granted, _ = lock.try_acquire(owner=f"probe{probes}")
        except (RedisRestarting, redis.ConnectionError):
            pass  # refused in the grace (or the old connection failing once)
        else:
            assert granted is None, f"granted {time.monotonic() - started:.2f}s after restart"
        probes += 1
        time.sleep(0.01)
    assert probes > 10
