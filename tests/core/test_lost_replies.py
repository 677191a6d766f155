"""Every operation answers a re-send as its first execution (issue 13, item 1).

A reply-dropping proxy (tests/faults.py) lets Redis run each script once and throws
its reply away; redis-py's default ``Retry`` then sends the same command again on a
new connection, so the script runs twice. The caller must see the first answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core import lock_scripts, semaphore_scripts
from celery_redislock.core import lock_scripts as lock_module
from celery_redislock.core.scripts import LuaScript
from tests.faults import FaultProxy


@pytest.fixture
def proxied(r: redis.Redis, fault_proxy: FaultProxy) -> Iterator[redis.Redis]:
    """A client through the proxy; every script cached, so the dropped reply is the
    script's own (not a NOSCRIPT answer)."""
    for module in (lock_module, semaphore_scripts):
        for value in vars(module).values():
            if isinstance(value, LuaScript):
                r.script_load(value.text)
    client = fault_proxy.client(socket_timeout=5)
    client.ping()
    yield client
    client.close()


def drop_next(proxy: FaultProxy, script: LuaScript) -> None:
    proxy.drop_reply(match=script.sha.encode())


def lease_fields(r: redis.Redis, lock: RedisLock) -> list[bytes]:
    return [f for f in r.hkeys(lock.keys.holders) if f.startswith(b"t:")]


# -- the lock -------------------------------------------------------------------------


def test_lock_acquire(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    lock = RedisLock(proxied, "job")
    drop_next(fault_proxy, lock_module.ACQUIRE)
    lease = lock.acquire(blocking=False)
    assert fault_proxy.dropped == 1
    assert lease is not None and len(lease_fields(r, lock)) == 1
    assert lease.release()


def test_lock_release(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    lock = RedisLock(proxied, "job")
    lost: list[object] = []
    with lock.acquire(on_lost=lost.append) as lease:  # type: ignore[union-attr]
        drop_next(fault_proxy, lock_module.RELEASE)
    # Leaving the block released once; the re-send reports the same success.
    assert fault_proxy.dropped == 1
    assert lease.released and not lease.lost and not lost
    assert not r.exists(lock.keys.holders)
    drop_next(fault_proxy, lock_module.RELEASE)
    again = lock.acquire(blocking=False)
    assert again is not None and again.release() is True and not again.lost


def test_lock_release_handing_the_lock_on(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    # A waiter is queued: the release grants it the lock at once (a new fence), and its
    # re-send is answered from the release's record.
    lock = RedisLock(proxied, "job")
    lease = lock.acquire()
    assert lease is not None
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(RedisLock(r, "job").acquire(timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not r.exists(lock.keys.queue) and time.monotonic() < deadline:
        time.sleep(0.01)
    drop_next(fault_proxy, lock_module.RELEASE)
    assert lease.release() is True and not lease.lost
    waiter.join(10)
    assert fault_proxy.dropped == 1 and got and got[0] is not None
    assert got[0].fence > lease.fence  # type: ignore[attr-defined]
    assert got[0].release()  # type: ignore[attr-defined]


def test_lock_release_leaves_no_record_when_uncontended(
    r: redis.Redis, proxied: redis.Redis
) -> None:
    # The common release writes nothing but its DEL: a re-send (a lost reply) is judged
    # by the lease's local deadline (see release_reply), not by a record in Redis.
    lease = RedisLock(proxied, "job").acquire()
    assert lease is not None and lease.release() is True
    assert r.dbsize() == 1 and r.exists(lease.holder.keys.fence)  # type: ignore[attr-defined]


def test_a_resent_release_of_a_lease_known_lost(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    # Known lost before the release (forced away, held() said so): a re-send finding it
    # gone is not taken for the first send's release, however early.
    lease = RedisLock(proxied, "job").acquire()
    assert lease is not None
    RedisLock(r, "job").force_release()
    assert lease.held() is False and lease.lost
    drop_next(fault_proxy, lock_module.RELEASE)
    assert lease.release() is False
    assert fault_proxy.dropped == 1


def test_a_resent_release_judged_by_the_lease_deadline() -> None:
    later, earlier = time.monotonic() + 30, time.monotonic() - 1
    assert lock_scripts.release_reply(1, [None], earlier)  # released by this send
    assert not lock_scripts.release_reply(0, [None], later)  # sent once: not ours
    # Sent again and found gone: the first send released it -- unless the lease's
    # deadline had passed, when it may have expired before the first send arrived.
    assert lock_scripts.release_reply(0, [None, None], later)
    assert not lock_scripts.release_reply(0, [None, None], earlier)


def test_lock_extend(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    lease = RedisLock(proxied, "job", ttl=5).acquire()
    assert lease is not None
    drop_next(fault_proxy, lock_module.EXTEND)
    assert lease.extend(20) is True and not lease.lost
    assert fault_proxy.dropped == 1 and 19_000 < r.pttl(lease.holder.keys.holders) <= 20_000  # type: ignore[attr-defined]
    assert lease.release()


def test_lock_renewal(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    drop_next(fault_proxy, lock_module.RENEW)
    lease = RedisLock(proxied, "job", ttl=0.6, renew=True).acquire()
    assert lease is not None
    assert fault_proxy.wait_dropped(1, timeout=3)
    time.sleep(0.5)  # past the first TTL: renewed despite the lost reply
    assert not lease.lost, lease.lost_reason
    assert lease.release()


def test_lock_adopt(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    lock = RedisLock(proxied, "job")
    queued = lock.acquire()
    assert queued is not None
    derived = f"run-{queued.token}"
    drop_next(fault_proxy, lock_module.ADOPT)
    lease = lock.adopt(queued.token, new_token=derived, owner="worker", ttl=10)
    assert fault_proxy.dropped == 1
    assert lease is not None and lease.token == derived and not lease.lost
    assert lease_fields(r, lock) == [b"t:" + derived.encode()]
    # A broker redelivery of the same message (another call) still cannot adopt.
    assert lock.adopt(queued.token, new_token=derived) is None
    assert lease.release()


def test_lock_release_owner(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    lock = RedisLock(proxied, "job")
    assert lock.acquire(owner="o") and lock.acquire(owner="o")
    drop_next(fault_proxy, lock_scripts.RELEASE_OWNER)
    assert lock.release_owner("o") == 2
    assert fault_proxy.dropped == 1 and not r.exists(lock.keys.holders)
    assert lock.release_owner("o") == 0  # another call: nothing left


def test_lock_queue_leave(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    holder = RedisLock(r, "job").acquire()
    assert holder is not None
    lock = RedisLock(proxied, "job")
    drop_next(fault_proxy, lock_module.LEAVE)
    assert lock.acquire(timeout=0.3) is None
    assert fault_proxy.dropped == 1
    assert r.zcard(lock.keys.queue) == 0 and lease_fields(r, lock) == [
        b"t:" + holder.token.encode()
    ]
    assert holder.release()


# -- the semaphore ----------------------------------------------------------------------


def test_semaphore_acquire_release(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    sem = RedisSemaphore(proxied, "pool", limit=2)
    drop_next(fault_proxy, semaphore_scripts.ACQUIRE)
    lease = sem.acquire(blocking=False)
    assert fault_proxy.dropped == 1 and lease is not None
    assert r.zcard(sem.keys.holders) == 1  # one permit, not two
    lost: list[object] = []
    lease.on_lost = lost.append
    drop_next(fault_proxy, semaphore_scripts.RELEASE)
    assert lease.release() is True
    assert fault_proxy.dropped == 2 and not lease.lost and not lost
    assert r.zcard(sem.keys.holders) == 0


def test_semaphore_extend_and_renewal(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    sem = RedisSemaphore(proxied, "pool", limit=2, ttl=0.6)
    lease = sem.acquire()
    assert lease is not None
    drop_next(fault_proxy, semaphore_scripts.EXTEND)
    assert lease.extend(0.6) is True and lease.release()
    drop_next(fault_proxy, semaphore_scripts.RENEW)
    renewed = sem.acquire(renew=True)
    assert renewed is not None
    assert fault_proxy.wait_dropped(2, timeout=3)
    time.sleep(0.5)
    assert not renewed.lost, renewed.lost_reason
    assert renewed.release()


def test_semaphore_release_owner(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    sem = RedisSemaphore(proxied, "pool", limit=3)
    assert sem.acquire(owner="o") and sem.acquire(owner="o") and sem.acquire(owner="p")
    drop_next(fault_proxy, semaphore_scripts.RELEASE_OWNER)
    assert sem.release_owner("o") == 2
    assert fault_proxy.dropped == 1 and r.zcard(sem.keys.holders) == 1


def test_semaphore_queue_leave(
    r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy
) -> None:
    held = RedisSemaphore(r, "pool", limit=1).acquire()
    assert held is not None
    sem = RedisSemaphore(proxied, "pool", limit=1)
    drop_next(fault_proxy, semaphore_scripts.LEAVE)
    assert sem.acquire(timeout=0.3) is None
    assert fault_proxy.dropped == 1 and r.zcard(sem.keys.queue) == 0
    assert held.release()


# -- parking -------------------------------------------------------------------------


def test_parking_release(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    from celery_redislock.core import parking

    for script in (parking._PARK, parking._RELEASE):
        r.script_load(script.text)
    published: list[parking.Parked] = []
    sem = parking.ParkingSemaphore(
        proxied,
        "pool",
        limit=1,
        ttl=30,
        reserve_ttl=30,
        on_claimed=lambda _s, c: published.extend(c),
    )
    lease = sem.acquire(blocking=False)
    assert lease is not None
    lost: list[object] = []
    lease.on_lost = lost.append
    assert sem.park(parking.new_entry_id(), b"run 1", owner="t1") == 1
    drop_next(fault_proxy, parking._RELEASE)
    # The release ran (and claimed the parked run); its reply was lost and the call
    # re-sent: it answers as the first did -- released, and the claimed run to publish
    # now, not after its reservation lapses (30 s) and a sweeper claims it again.
    assert lease.release() is True
    assert fault_proxy.dropped == 1 and not lease.lost and not lost
    assert [p.payload for p in published] == [b"run 1"]
    assert r.zcard(sem.claimed_key) == 1 and r.zcard(sem.keys.holders) == 1


def test_parking_park(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    from celery_redislock.core import parking

    r.script_load(parking._PARK.text)
    published: list[parking.Parked] = []
    sem = parking.ParkingSemaphore(
        proxied,
        "pool",
        limit=1,
        ttl=30,
        reserve_ttl=30,
        on_claimed=lambda _s, c: published.extend(c),
    )
    # A permit is free (the holder released between the refusal and the park): the park
    # claims its own entry at once. Its reply lost, the re-send still hands the entry
    # to be published now, not after a 30 s reservation and a sweeper.
    drop_next(fault_proxy, parking._PARK)
    assert sem.park("a" * 32, b"run 1", owner="t1") == 0
    assert fault_proxy.dropped == 1 and [p.payload for p in published] == [b"run 1"]
    # Parked behind others: the re-send answers the same place.
    assert sem.park("b" * 32, b"run 2", owner="t2") == 1
    drop_next(fault_proxy, parking._PARK)
    assert sem.park("c" * 32, b"run 3", owner="t3") == 2
    assert fault_proxy.dropped == 2 and r.zcard(sem.parked_key) == 2


def test_parking_give_back(r: redis.Redis, proxied: redis.Redis, fault_proxy: FaultProxy) -> None:
    from celery_redislock.core import parking

    r.script_load(parking._RETURN.text)
    sem = parking.ParkingSemaphore(proxied, "pool", limit=1, ttl=30, reserve_ttl=30)
    assert sem.park("a" * 32, b"run 1") == 0  # claimed at once (no on_claimed here)
    drop_next(fault_proxy, parking._RETURN)
    # Returned to the dead letters once; the re-send answers True as the first did (the
    # caller then hands the freed permit on at once, not at the next sweep).
    assert sem.give_back("a" * 32, dead="bad payload") is True
    assert fault_proxy.dropped == 1 and r.llen(sem.dead_key) == 1
    assert r.zcard(sem.claimed_key) == 0 and r.zcard(sem.keys.holders) == 0
