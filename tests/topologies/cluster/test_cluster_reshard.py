"""Resharding a slot that holds a held lock with queued waiters, on a real cluster:
``CLUSTER SETSLOT ... IMPORTING/MIGRATING``, ``MIGRATE ... KEYS`` key by key, then
``SETSLOT ... NODE``. Exclusion is kept while the slot is half moved, the holder's
release works on the new owner, and the waiters are granted the lock in turn at once
(far sooner than the holder's 15 s TTL, which a release lost to the move would cost)."""

from __future__ import annotations

import threading
import time

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from celery_redislock import RedisLock
from celery_redislock.core.pubsub import use_sharded_pubsub
from celery_redislock.testing_cluster import LocalCluster

from .helpers import client_in_mode, name_on, require_sharded, slot_of, wait_queued

MODES = ["sharded", "classic"]


class Section:
    """Critical sections run by the waiters: who ran, when, and never two at once."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside = 0
        self.overlaps = 0
        self.granted: list[tuple[float, int]] = []  # (monotonic, fence)

    def run(self, lock: RedisLock) -> None:
        lease = lock.acquire(timeout=20)
        assert lease is not None
        with self.guard:
            self.inside += 1
            self.overlaps += self.inside > 1
            self.granted.append((time.monotonic(), lease.fence))
        time.sleep(0.05)
        with self.guard:
            self.inside -= 1
        assert lease.release()


@pytest.mark.parametrize("mode", MODES)
def test_resharding_a_held_lock_keeps_it_and_its_waiters(
    cluster: LocalCluster, rc: RedisCluster, mode: str
) -> None:
    require_sharded(cluster, mode)
    source, target = cluster._primaries()[:2]
    name = name_on(cluster, source, f"reshard-{mode}")
    slot = slot_of(name)
    with client_in_mode(cluster, mode) as holder_client:
        lock = RedisLock(holder_client, name, ttl=15)
        holder = lock.acquire(blocking=False)
        assert holder is not None
        section, threads, clients = Section(), [], []
        for _ in range(3):
            client = cluster.client(socket_timeout=2, socket_connect_timeout=1)
            use_sharded_pubsub(client, mode == "sharded")
            clients.append(client)
            thread = threading.Thread(
                target=section.run, args=(RedisLock(client, name, ttl=15),), daemon=True
            )
            thread.start()
            threads.append(thread)
            wait_queued(lock, len(threads))  # queued in this order

        # A prober tries to take the lock after each key moved; a script whose keys
        # are half moved answers TRYAGAIN (an error, never a lease).
        prober = RedisLock(rc, name, ttl=15)
        rc.RedisClusterRequestTTL = 2  # give up on TRYAGAIN at once, not after 16 tries
        outcomes: list[str] = []

        def probe() -> None:
            try:
                outcomes.append("granted" if prober.acquire(blocking=False) else "refused")
            except RedisError as exc:
                outcomes.append(type(exc).__name__)

        moved = cluster.move_slot(slot, target, between=probe)
        assert moved == 5  # holders, fence, queue, alive, asks
        assert cluster.owner(slot) is target
        assert "granted" not in outcomes and "refused" in outcomes, outcomes
        assert prober.acquire(blocking=False) is None and lock.info().waiters == 3

        released_at = time.monotonic()
        assert holder.release()  # through the new owner (MOVED followed)
        for thread in threads:
            thread.join(20)
    for client in clients:
        client.close()
    assert section.overlaps == 0 and len(section.granted) == 3
    first_grant = section.granted[0][0] - released_at
    # ~0.1 s by the notification, <= ~1 s by the fallback poll (MAX_POLL) on a quiet
    # machine; a release that missed the moved keys would leave the lock held 15 s.
    assert first_grant < 5.0, f"first waiter granted {first_grant:.3f} s after the release"
    fences = [fence for _, fence in section.granted]
    assert fences == sorted(fences) and fences[0] > holder.fence
