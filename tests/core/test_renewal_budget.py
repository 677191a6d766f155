"""Renewal has its own path and budget (issue 13, item 9): the renewer talks to Redis
on a connection of its own, opened and with its scripts loaded as soon as a lease is
to be renewed, so a lease survives its first renewal whenever RTT <= TTL / 5."""

from __future__ import annotations

import time

import redis

from celery_redislock import RedisLock, RedisSemaphore
from tests.faults import FaultProxy


def test_leases_survive_renewal_at_a_round_trip_of_a_fifth_of_their_ttl(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    r.script_flush()  # the first renewal also finds its script missing
    client = fault_proxy.client()
    client.ping()
    fault_proxy.delay = 0.1  # 200 ms round trip: ttl=1 s is five of them
    lock_leases = [RedisLock(client, f"slow-{i}", ttl=1.0).acquire(renew=True) for i in range(3)]
    permit = RedisSemaphore(client, "slow-pool", limit=2, ttl=1.0).acquire(renew=True)
    leases = [*lock_leases, permit]
    assert all(lease is not None for lease in leases)
    time.sleep(2.5)  # several renewals, the first one included
    lost = [lease.lost_reason for lease in leases if lease is not None and lease.lost]
    assert not lost, lost
    for lease in leases:
        assert lease is not None and lease.release()
    client.close()
