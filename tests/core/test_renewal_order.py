"""Renewal never undoes an explicit TTL (issue 13, item 4): an explicit change of a
renewed lease gets a new generation, which Redis checks before applying a renewal
composed earlier; and renewal goes on at the new TTL from the change on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core import lock_scripts, semaphore_scripts
from tests.faults import FaultProxy


def _changed_under_a_stalled_renewal(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str, change: Callable[[Any], bool]
) -> tuple[Any, int, redis.Redis]:
    """A renewed lease (TTL 1.5 s) whose renewal stalls on its way; ``change(lease)``
    (which must succeed) meanwhile; then the stalled renewal reaches Redis. Returns the
    lease, its milliseconds left on the server and the client (to close)."""
    client = fault_proxy.client()
    primitive = (
        RedisLock(client, "job", ttl=1.5)
        if kind == "lock"
        else RedisSemaphore(client, "job", limit=1, ttl=1.5)
    )
    script = lock_scripts.RENEW if kind == "lock" else semaphore_scripts.RENEW
    fault_proxy.hold(match=script.sha.encode())  # the renewal stalls on its way
    lease = primitive.acquire(renew=True)
    assert lease is not None
    assert fault_proxy.wait_held(1, timeout=5)
    assert change(lease)
    fault_proxy.release_held()  # the stalled renewal (TTL 1.5 s) reaches Redis now
    time.sleep(0.3)
    ttl_left = (
        r.pttl(primitive.keys.holders)
        if kind == "lock"
        else int(r.zscore(primitive.keys.holders, lease.token) or 0) - int(r.time()[0]) * 1000
    )
    return lease, ttl_left, client


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_renewal_in_flight_does_not_cut_back_a_hand_over(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str
) -> None:
    _, ttl_left, client = _changed_under_a_stalled_renewal(
        r, fault_proxy, kind, lambda lease: lease.hand_over(10)
    )
    # Before: the renewal landed after the hand-over and cut it back to 1.5 s.
    assert ttl_left > 5000, ttl_left
    client.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_renewal_in_flight_does_not_cut_back_an_addition(
    r: redis.Redis, fault_proxy: FaultProxy, kind: str
) -> None:
    # About 11 s left after the addition.
    lease, ttl_left, client = _changed_under_a_stalled_renewal(
        r, fault_proxy, kind, lambda lease: lease.extend(10, add=True)
    )
    # Without the addition's generation the renewal would cut it back to 1.5 s.
    assert ttl_left > 5000, ttl_left
    assert lease.release()
    client.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_shorter_explicit_ttl_is_renewed_on_its_own_schedule(r: redis.Redis, kind: str) -> None:
    primitive = (
        RedisLock(r, "job", ttl=3) if kind == "lock" else RedisSemaphore(r, "job", limit=1, ttl=3)
    )
    lease = primitive.acquire(renew=True)
    assert lease is not None
    assert lease.extend(0.6)
    time.sleep(1.5)  # 2.5 of the new TTLs
    # Before: the renewer kept the 3 s schedule (due 1 s after the grant): the lease
    # expired at 0.6 s and was reported lost ("Redis did not answer in time").
    assert not lease.lost, lease.lost_reason
    assert primitive.acquire(blocking=False) is None
    assert lease.release()
