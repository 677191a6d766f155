"""A lease removed by ``release_all`` (an operator's clean-up) is lost to its holder:
its own ``release()`` answers False and sets ``lost``, as after ``force_release`` (#30
item 6). Locks and semaphores, with and without queued waiters (a lock's release
writes its record for a re-send only when waiters are queued), and a re-entered lock
(several leases)."""

from __future__ import annotations

import pytest
import redis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core import release_all
from celery_redislock.core.keys import DEFAULT_PREFIX


def _queue_waiter(primitive: RedisLock | RedisSemaphore, token: str) -> None:
    """Put ``token`` in the primitive's wait queue (as a blocked acquire would)."""
    from celery_redislock.core.operations import run

    if isinstance(primitive, RedisLock):
        scripts = primitive._scripts
        from celery_redislock.core.lock_scripts import ACQUIRE

        ACQUIRE(
            primitive.client, scripts.acquire_keys, scripts.acquire_args(token, 5000, None, True)
        )
    else:
        assert run(primitive.client, primitive._scripts.attempt(token, "", 5000, True))[0][0] == 0


@pytest.mark.parametrize("queued", [False, True], ids=["alone", "waiters-queued"])
def test_lock_lease_removed_by_release_all_is_lost(r: redis.Redis, queued: bool) -> None:
    lock = RedisLock(r, "job", ttl=30)
    lease = lock.acquire()
    assert lease is not None
    if queued:
        _queue_waiter(lock, "waiter.x")
    assert release_all(r, prefix=DEFAULT_PREFIX) == 1
    assert lease.release() is False
    assert lease.lost and "no longer held" in lease.lost_reason


def test_reentered_lock_leases_removed_by_release_all_are_lost(r: redis.Redis) -> None:
    lock = RedisLock(r, "job", ttl=30)
    first = lock.acquire(owner="o")
    second = lock.acquire(blocking=False, owner="o")
    assert first is not None and second is not None
    assert release_all(r, prefix=DEFAULT_PREFIX) == 2
    assert second.release() is False and second.lost
    assert first.release() is False and first.lost


@pytest.mark.parametrize("queued", [False, True], ids=["alone", "waiters-queued"])
def test_semaphore_lease_removed_by_release_all_is_lost(r: redis.Redis, queued: bool) -> None:
    sem = RedisSemaphore(r, "pool", limit=1, ttl=30)
    lease = sem.acquire()
    assert lease is not None
    if queued:
        _queue_waiter(sem, "waiter.x")
    assert release_all(r, prefix=DEFAULT_PREFIX) == 1
    assert lease.release() is False
    assert lease.lost and "no longer held" in lease.lost_reason


def test_holder_release_is_still_idempotent_after_a_lost_reply(r: redis.Redis) -> None:
    # The fix must not touch the holder's own release: released once, a re-send of
    # that release (here: the same script call again) still answers as the first.
    sem = RedisSemaphore(r, "pool", limit=1, ttl=30)
    lease = sem.acquire()
    assert lease is not None
    assert sem._release_token(lease.token) is True
    assert sem._release_token(lease.token) is True
