"""RedisSemaphore.release_owner / force_release on a real redis-server."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_redislock import ConfigurationError, RedisSemaphore


def test_release_owner_releases_exactly_that_owners_permits(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=4, ttl=30)
    mine = [sem.acquire(owner="task-1@abc"), sem.acquire(owner="task-1@abc")]
    other = sem.acquire(owner="task-2@def")
    anonymous = sem.acquire()
    assert all(mine) and other and anonymous
    assert sem.release_owner("task-1@abc") == 2
    assert sorted(h.owner or "" for h in sem.info().holders) == ["", "task-2@def"]
    assert sem.release_owner("task-1@abc") == 0  # nothing left of it: a no-op
    assert sem.release_owner("task-1") == 0  # exact owner ids only, never a prefix
    # The released leases are gone for their holders too: never released twice.
    assert mine[0] is not None and not mine[0].release() and mine[0].lost
    assert other is not None and other.release()


def test_release_owner_counts_live_leases_only(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=2, ttl=0.05)
    assert sem.acquire(owner="gone")
    time.sleep(0.1)
    assert sem.release_owner("gone") == 0
    assert sem.info().holders == []


def test_force_release_frees_every_permit(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=3, ttl=30)
    leases = [sem.acquire(owner=f"o{i}") for i in range(3)]
    assert sem.force_release() == 3
    assert sem.available() == 3
    assert all(lease is not None and not lease.release() for lease in leases)
    assert sem.force_release() == 0


def test_release_owner_wakes_a_blocked_waiter_at_once(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, ttl=30)
    assert sem.acquire(owner="dead-child")
    got: list[float] = []

    def wait() -> None:
        lease = sem.acquire(timeout=10)
        assert lease is not None
        got.append(time.monotonic())
        lease.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)  # the waiter is queued and asleep
    released_at = time.monotonic()
    assert sem.release_owner("dead-child") == 1
    waiter.join(10)
    # Woken by the release's notification, sooner than the fallback poll (1 s).
    assert got and got[0] - released_at < 0.5


@pytest.mark.parametrize("owner", ["", None, 3])
def test_release_owner_rejects_a_missing_owner(r: redis.Redis, owner: object) -> None:
    with pytest.raises(ConfigurationError, match="owner"):
        RedisSemaphore(r, "s", limit=1).release_owner(owner)  # type: ignore[arg-type]
