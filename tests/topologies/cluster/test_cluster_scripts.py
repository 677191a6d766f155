"""Every script of the core, on every path, run on a real Redis Cluster.

The lock's and the semaphore's keys share one hash tag, so each script runs on the
primary serving that slot; the wake-up messages are published from inside the scripts.
"""

from __future__ import annotations

import time
from importlib import resources

from redis.cluster import RedisCluster

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core.journal import ParkJournal
from celery_redislock.core.parking import (
    DUPLICATE,
    TAKEN,
    Parked,
    ParkingSemaphore,
    new_entry_id,
)
from celery_redislock.core.redelivery import ALIVE, ENDED, mark_ran, retake

from .helpers import Waiter, wait_queued

SCRIPTS = {
    path.name
    for path in resources.files("celery_redislock.core.lua").iterdir()
    if path.name.endswith(".lua") and not path.name.startswith("lib_")
}


def test_lock_paths(rc: RedisCluster, name: str, ran: set[str]) -> None:
    lock = RedisLock(rc, name, ttl=5)
    first = lock.acquire(blocking=False)  # uncontended
    assert first is not None
    assert lock.try_acquire() == (None, None)  # contended: refused, holder has no owner
    waiter = Waiter(lock, timeout=5)  # contended: queues
    waiter.start()
    wait_queued(lock, 1)
    assert first.extend(10) and first.extend(1, add=True) and first.held()
    info = lock.info()
    assert (len(info.holders), info.waiters, info.fence) == (1, 1, first.fence)
    released_at = time.monotonic()
    assert first.release()  # hands the lock to the waiter
    waiter.join(5)
    assert waiter.lease is not None and waiter.lease.fence > first.fence
    assert waiter.at - released_at < 0.5
    assert not lock._release_token("unknown-token")  # not ours: changes nothing
    quitter = Waiter(lock, timeout=0.3)  # times out: leaves the queue
    quitter.start()
    quitter.join(5)
    assert quitter.lease is None and lock.info().waiters == 0
    assert waiter.lease.release() and not lock.locked()

    # Re-entry by owner, adopt, release_owner, force_release.
    one = lock.acquire(owner="task-1", blocking=False)
    two = lock.acquire(owner="task-1", blocking=False)
    assert one is not None and two is not None and two.fence > one.fence
    assert lock.try_acquire(owner="task-2") == (None, "task-1")
    assert one.release() and lock.locked()
    adopted = lock.adopt(two.token, owner="task-3")
    assert adopted is not None and not two.release()
    assert lock.release_owner("task-1") == 0 and lock.release_owner("task-3") == 1
    assert not lock.locked()
    assert lock.acquire(blocking=False) is not None and lock.force_release() == 1

    # Renewal: a 0.6 s lease held for 1.5 s.
    renewed = lock.acquire(ttl=0.6, renew=True, blocking=False)
    assert renewed is not None
    time.sleep(1.5)
    assert not renewed.lost and renewed.release(), renewed.lost_reason
    assert ran >= {name for name in SCRIPTS if name.startswith("lock_")} | {"queue_leave.lua"}


def test_semaphore_paths(rc: RedisCluster, name: str, ran: set[str]) -> None:
    semaphore = RedisSemaphore(rc, name, limit=2, ttl=5)
    first = semaphore.acquire(blocking=False, owner="a")
    second = semaphore.acquire(blocking=False, owner="b")
    assert first is not None and second is not None and second.fence > first.fence
    assert semaphore.acquire(blocking=False) is None
    waiter = Waiter(semaphore, timeout=5)
    waiter.start()
    wait_queued(semaphore, 1)
    assert first.extend(10) and first.extend(1, add=True) and first.held()
    info = semaphore.info()
    assert (len(info.holders), info.waiters, info.limit) == (2, 1, 2)
    released_at = time.monotonic()
    assert first.release()  # the freed permit goes to the waiter
    waiter.join(5)
    assert waiter.lease is not None and waiter.lease.fence > second.fence
    assert waiter.at - released_at < 0.5
    assert not first.extend()
    assert semaphore.release_owner("b") == 1 and semaphore.force_release() == 1
    assert semaphore.available() == 2
    renewed = semaphore.acquire(ttl=0.6, renew=True, blocking=False)
    assert renewed is not None
    time.sleep(1.5)
    assert not renewed.lost and renewed.release(), renewed.lost_reason
    assert ran >= {name for name in SCRIPTS if name.startswith("semaphore_")}


def test_parking_paths(rc: RedisCluster, name: str, ran: set[str]) -> None:
    claimed: list[Parked] = []
    pool = ParkingSemaphore(
        rc, name, limit=1, ttl=5, on_claimed=lambda _, entries: claimed.extend(entries)
    )
    holder = pool.acquire(blocking=False)
    assert holder is not None
    first, second = new_entry_id(), new_entry_id()
    assert (pool.park(first, b"run 1"), pool.park(second, b"run 2")) == (1, 2)
    assert pool.parking_info().parked == 2
    assert holder.release()  # claims the head: its permit is reserved, payload published
    assert [entry.payload for entry in claimed] == [b"run 1"]
    assert pool.give_back(first)  # could not publish: back to its place
    assert pool.pump()[1][0].id == first
    status, lease = pool.take(first, owner="task-1")
    assert status == TAKEN and lease is not None
    assert pool.take(first)[0] == DUPLICATE
    assert lease.release() and [entry.payload for entry in claimed][-1] == b"run 2"
    assert ran >= {name for name in SCRIPTS if name.startswith("park")}


def test_redelivery_paths(rc: RedisCluster, name: str, ran: set[str]) -> None:
    pool = ParkingSemaphore(rc, name, limit=1, ttl=5)
    entry = new_entry_id()
    assert pool.park(entry, b"run", owner="t1") == 0  # a permit free: claimed at once
    status, lease = pool.take(entry, "t1@first")
    assert status == TAKEN and lease is not None
    assert pool.take(entry, "t1@copy")[0] == DUPLICATE
    assert retake(pool, entry, "t1@copy", ttl=5, memory=60)[0] == ALIVE  # its key: same tag
    mark_ran(pool, entry, 60)
    assert retake(pool, entry, "t1@copy", ttl=5, memory=60)[0] == ENDED
    assert lease.release()
    assert "redelivered_take.lua" in ran


def test_journal_paths(rc: RedisCluster, name: str, ran: set[str]) -> None:
    journal = ParkJournal(rc, name)  # its keys share the hash tag {parked}
    first, second = new_entry_id(), new_entry_id()
    journal.put(first, b"run 1", 60.0)
    journal.put(second, b"run 2", 60.0)
    journal.put(first, b"run 1", 60.0)  # re-sent: keeps its place
    assert list(journal.entries()) == [(first, b"run 1"), (second, b"run 2")]
    assert journal.drop(first) and not journal.drop(first) and len(journal) == 1
    assert not journal.knows("m1")
    journal.learn("m1")
    assert journal.knows("m1")
    assert ran >= {name for name in SCRIPTS if name.startswith("journal_")}


def test_every_script_is_covered() -> None:
    """The tests above check every script of the core ran: a script named otherwise
    must be added to one of them. Redlock's scripts run on independent masters, not
    on a cluster (tests/topologies/redlock); ``boot_mark.lua`` is never sent to a
    cluster, whose restart grace is off (see core/restart.py: its keys are in another
    slot; tests/core covers it). The rate limiter's run on a cluster in
    test_cluster_ratelimit.py, beat's in test_cluster_beat.py."""
    prefixes = ("lock_", "semaphore_", "park", "redlock_", "journal_", "ratelimit_", "beat_")
    others = {name for name in SCRIPTS if not name.startswith(prefixes)}
    assert others == {"queue_leave.lua", "boot_mark.lua", "redelivered_take.lua"}
    assert len(SCRIPTS) >= 14
