"""RedisLock and its leases against a real redis-server: the single-process contract.

Waiting, wake-ups and crashes are in test_lock_waiting.py; many processes in
test_lock_concurrency.py; the scripts called directly in test_lock_scripts.py.
"""

from __future__ import annotations

import itertools
import os
import re
import time
import warnings
from typing import Any

import pytest
import redis

from celery_redislock import ConfigurationError, Lease, LockNotOwned, RedisLock
from celery_redislock.core import lock as lock_module
from celery_redislock.core import primitive as primitive_module
from tests.faults import FaultProxy


@pytest.fixture
def lock(r: redis.Redis) -> RedisLock:
    return RedisLock(r, "job", ttl=30)


def holder_tokens(r: redis.Redis, lock: RedisLock) -> set[str]:
    """Tokens of the leases stored in Redis (live or not yet swept)."""
    fields = r.hkeys(lock.keys.holders)
    return {f.decode()[2:] for f in fields if f.startswith(b"t:")}


# -- acquire / release / locked -----------------------------------------------------


def test_acquire_release_round_trip(r: redis.Redis, lock: RedisLock) -> None:
    assert not lock.locked()
    lease = lock.acquire()
    assert isinstance(lease, Lease)
    assert lock.locked()
    assert holder_tokens(r, lock) == {lease.token}
    assert lease.name == "job" and lease.owner is None
    assert not lease.lost and not lease.released
    assert lease.release() is True
    assert lease.released and not lease.lost
    assert not lock.locked()
    assert not r.exists(lock.keys.holders)


def test_second_acquire_without_owner_is_refused(lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None
    started = time.monotonic()
    assert lock.acquire(blocking=False) is None
    assert lock.acquire(blocking=False, owner="someone") is None
    assert time.monotonic() - started < 0.5  # non-blocking never waits
    assert lease.release()
    again = lock.acquire(blocking=False)
    assert again is not None and again.token != lease.token
    assert again.release()


def test_non_blocking_refusal_does_not_queue(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lock.acquire(blocking=False) is None
    assert r.zcard(lock.keys.queue) == 0
    assert lock.info().waiters == 0
    assert lease is not None and lease.release()


def test_timeout_zero_returns_none_and_leaves_no_waiter(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lock.acquire(timeout=0) is None
    assert r.zcard(lock.keys.queue) == 0 and r.zcard(lock.keys.alive) == 0
    assert lease is not None and lease.release()


def test_release_twice_is_false_the_second_time(lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None
    assert lease.release() is True
    assert lease.release() is False
    assert not lock.locked()


def test_tokens_are_32_hex_digits_from_secrets(lock: RedisLock, monkeypatch: Any) -> None:
    # 32 random hex digits (128 bits), then ".<tag>": the same tag for every token of
    # this process, naming its wake-up channel.
    tokens = []
    for _ in range(50):
        lease = lock.acquire()
        assert lease is not None
        tokens.append(lease.token)
        assert lease.release()
    assert len({token[:32] for token in tokens}) == 50
    assert all(re.fullmatch(r"[0-9a-f]{32}\.[0-9a-f]{8}", token) for token in tokens)
    assert len({token[33:] for token in tokens}) == 1

    calls = []

    def fake_token_hex(nbytes: int) -> str:
        calls.append(nbytes)
        return "f" * (2 * nbytes)

    monkeypatch.setattr(lock_module.secrets, "token_hex", fake_token_hex)
    lease = lock.acquire()
    assert lease is not None and lease.token.startswith("f" * 32 + ".") and calls == [16]
    assert lease.release()


def test_locked_and_info_do_not_change_anything(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire(owner="task-1")
    assert lease is not None
    before = (r.hgetall(lock.keys.holders), r.get(lock.keys.fence))
    info = lock.info()
    assert lock.locked()
    assert (r.hgetall(lock.keys.holders), r.get(lock.keys.fence)) == before
    assert r.pttl(lock.keys.holders) <= 30_000
    assert info.kind == "lock" and info.name == "job" and info.held
    assert info.owner == "task-1" and info.fence == lease.fence and info.waiters == 0
    assert info.since is not None and abs(info.since - r.time()[0]) < 5
    [holder] = info.holders
    assert holder.token_hint == lease.token[:8] and len(holder.token_hint) < len(lease.token)
    assert holder.fence == lease.fence and holder.owner == "task-1"
    assert 29.0 < holder.ttl_left <= 30.0
    assert lease.release()
    free = lock.info()
    assert not free.held and free.holders == [] and free.owner is None and free.fence is None
    assert free.ttl_left == 0.0


def test_repr_does_not_leak_the_token(lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None
    assert lease.token not in repr(lease) and "held" in repr(lease)
    lease.release()
    assert "released" in repr(lease)
    assert "job" in repr(lock)


# -- expiry, millisecond precision --------------------------------------------------------


def test_ttl_has_millisecond_precision(r: redis.Redis) -> None:
    lock = RedisLock(r, "short", ttl=0.05)
    lease = lock.acquire()
    assert lease is not None and lease.ttl == 0.05
    assert 30 <= r.pttl(lock.keys.holders) <= 50
    time.sleep(0.1)
    assert not lock.locked()
    assert lease.lost and lease.remaining() < 0
    assert lock.acquire(blocking=False) is not None

    odd = RedisLock(r, "odd", ttl=1.2345)
    lease = odd.acquire()
    assert lease is not None
    assert 1150 < r.pttl(odd.keys.holders) <= 1235
    assert lease.ttl == pytest.approx(1.2345, abs=0.001)


def test_held_until_its_ttl_then_free(r: redis.Redis) -> None:
    lock = RedisLock(r, "expiring", ttl=0.3)
    lease = lock.acquire()
    assert lease is not None
    time.sleep(0.1)
    assert lock.locked() and not lease.lost
    assert lock.acquire(blocking=False) is None
    time.sleep(0.35)
    assert not lock.locked() and lease.lost
    assert "expired" in lease.lost_reason


def test_acquire_ttl_overrides_the_lock_ttl(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire(ttl=0.2)
    assert lease is not None and lease.ttl == 0.2
    assert r.pttl(lock.keys.holders) <= 200
    assert lock.ttl == 30.0


# -- ownership: stale leases ------------------------------------------------------------


def test_stale_lease_cannot_release_the_new_holders_lock(r: redis.Redis) -> None:
    lock = RedisLock(r, "stale", ttl=0.05)
    old = lock.acquire()
    assert old is not None
    time.sleep(0.08)
    new = lock.acquire(blocking=False, ttl=5)
    assert new is not None and new.fence > old.fence
    assert old.release() is False
    assert old.lost
    assert lock.locked() and holder_tokens(r, lock) == {new.token}
    assert 4000 < r.pttl(lock.keys.holders) <= 5000
    assert new.release() is True


def test_stale_lease_cannot_extend_the_new_holders_lock(r: redis.Redis) -> None:
    lock = RedisLock(r, "stale", ttl=0.05)
    old = lock.acquire()
    assert old is not None
    time.sleep(0.08)
    new = lock.acquire(blocking=False, ttl=1)
    assert new is not None
    assert old.extend(10) is False and old.lost
    assert r.pttl(lock.keys.holders) <= 1000  # the new holder's TTL, not 10 s
    assert holder_tokens(r, lock) == {new.token}
    assert new.release()


# -- extend -----------------------------------------------------------------------


def test_extend_resets_the_ttl(r: redis.Redis) -> None:
    lock = RedisLock(r, "ext", ttl=0.2)
    lease = lock.acquire()
    assert lease is not None
    assert lease.extend(2) is True
    assert lease.ttl == 2.0
    assert 1900 < r.pttl(lock.keys.holders) <= 2000
    time.sleep(0.3)  # past the first TTL
    assert lock.locked() and not lease.lost
    assert lease.extend() is True  # default: the lease's current ttl (2 s)
    assert 1900 < r.pttl(lock.keys.holders) <= 2000
    # Shorter works too. Long enough that a slow reply on a loaded machine still comes
    # within it: one later than the TTL it set is no confirmation (see below).
    assert lease.extend(0.25) is True
    assert r.pttl(lock.keys.holders) <= 250
    time.sleep(0.3)
    assert not lock.locked()


@pytest.mark.parametrize("add", [False, True])
def test_an_extend_confirmed_after_the_ttl_it_set_is_no_confirmation(
    r: redis.Redis, fault_proxy: FaultProxy, add: bool
) -> None:
    # Every reply through the proxy comes >= 0.3 s after its request was sent (0.15 s
    # each way): past the 0.2 s the extend sets, or the ~0.2 s left on the server after
    # adding 0.05 s to the ~0.15 s the request found there. Redis held the lease and set
    # the TTL, but by this process's clock that TTL ran out before the answer came: the
    # lease cannot be known held now. Before: True, with remaining() about -0.1 s.
    # After: False and lost, as Redlock's extend (e21b41d).
    lock = RedisLock(fault_proxy.client(), "late", ttl=0.3 if add else 5)
    lease = lock.acquire()
    assert lease is not None
    assert lease.extend(0.001, add=True)  # the scripts loaded: one round trip below
    fault_proxy.delay = 0.15
    extended = lease.extend(0.05, add=True) if add else lease.extend(0.2)
    left = lease.remaining()
    assert not extended, f"extend() True with {left:.3f} s left"
    assert lease.lost and "after the TTL it set ran out" in lease.lost_reason


def test_an_extend_confirmed_in_time_through_a_slow_link_is_kept(
    r: redis.Redis, fault_proxy: FaultProxy
) -> None:
    # The control: the same 0.2 s round trip, well within the TTL set.
    lock = RedisLock(fault_proxy.client(), "slow", ttl=5)
    lease = lock.acquire()
    assert lease is not None
    fault_proxy.delay = 0.1
    assert lease.extend(2) is True and 1.7 < lease.remaining() < 2 and not lease.lost
    fault_proxy.delay = 0.0
    assert lease.release() is True


def test_extend_never_recreates_an_expired_lock(r: redis.Redis) -> None:
    lock = RedisLock(r, "gone", ttl=0.05)
    lease = lock.acquire()
    assert lease is not None
    time.sleep(0.08)
    assert lease.extend(10) is False
    assert lease.lost and "extend" in lease.lost_reason
    assert not lock.locked()
    assert not r.exists(lock.keys.holders)


def test_extend_after_release_is_false(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None and lease.release()
    assert lease.extend() is False
    assert not r.exists(lock.keys.holders)


def test_lost_lease_runs_on_lost_once(r: redis.Redis) -> None:
    lock = RedisLock(r, "cb", ttl=0.05)
    seen: list[Lease] = []
    lease = lock.acquire(on_lost=seen.append)
    assert lease is not None
    time.sleep(0.08)
    assert lease.release() is False
    assert lease.extend() is False
    assert lease.lost and lease.lost_event.is_set() and lease.wait_lost(0)
    assert seen == [lease]


# -- re-entry ---------------------------------------------------------------------------


def test_same_owner_reenters_counted(r: redis.Redis, lock: RedisLock) -> None:
    first = lock.acquire(owner="task-1")
    second = lock.acquire(owner="task-1", blocking=False)
    assert first is not None and second is not None
    assert second.token != first.token and second.fence > first.fence
    assert second.owner == "task-1"
    assert holder_tokens(r, lock) == {first.token, second.token}
    assert len(lock.info().holders) == 2
    assert first.release() is True
    assert lock.locked()  # the second acquisition still holds it
    assert lock.acquire(blocking=False) is None
    assert second.release() is True
    assert not lock.locked()


def test_reentry_released_in_any_order(lock: RedisLock) -> None:
    leases = [lock.acquire(owner="o", blocking=False) for _ in range(3)]
    assert all(lease is not None for lease in leases)
    for lease in reversed(leases[1:]):
        assert lease is not None and lease.release()
        assert lock.locked()
    assert leases[0] is not None and leases[0].release()
    assert not lock.locked()


def test_different_owner_and_no_owner_are_refused(lock: RedisLock) -> None:
    lease = lock.acquire(owner="task-1")
    assert lease is not None
    assert lock.acquire(owner="task-2", blocking=False) is None
    assert lock.acquire(owner="task-2", timeout=0.1) is None
    assert lock.acquire(blocking=False) is None
    lease.release()


def test_without_owner_no_reentry_even_for_the_same_lock_object(r: redis.Redis) -> None:
    lock = RedisLock(r, "plain")
    lease = lock.acquire()
    assert lease is not None
    assert lock.acquire(blocking=False) is None
    lease.release()


def test_reentered_lock_lives_as_long_as_its_longest_lease(r: redis.Redis) -> None:
    lock = RedisLock(r, "long", ttl=30)
    short = lock.acquire(owner="o", ttl=0.1)
    long = lock.acquire(owner="o", ttl=2, blocking=False)
    assert short is not None and long is not None
    assert r.pttl(lock.keys.holders) > 1500
    time.sleep(0.15)
    assert lock.locked()
    assert short.release() is False  # expired on its own
    assert lock.locked()
    assert long.release() is True
    assert not lock.locked()


def test_owner_reentry_after_expiry_is_a_fresh_grant(r: redis.Redis) -> None:
    lock = RedisLock(r, "fresh", ttl=0.05)
    first = lock.acquire(owner="o")
    assert first is not None
    time.sleep(0.08)
    second = lock.acquire(owner="o", blocking=False)
    assert second is not None and second.fence > first.fence
    assert holder_tokens(r, lock) == {second.token}
    assert second.release()


# -- fences -----------------------------------------------------------------------------


def test_fences_strictly_increase_across_grants(r: redis.Redis, lock: RedisLock) -> None:
    fences = []
    for i in range(30):
        lease = lock.acquire(owner="o" if i % 3 else None)
        assert lease is not None
        fences.append(lease.fence)
        if i % 3 == 1:  # re-entry grants a fence too
            extra = lock.acquire(owner="o", blocking=False)
            assert extra is not None
            fences.append(extra.fence)
            extra.release()
        lease.release()
    assert all(b > a for a, b in itertools.pairwise(fences))
    assert all(isinstance(f, int) for f in fences)


def test_fences_keep_increasing_when_the_fence_key_is_lost(r: redis.Redis, lock: RedisLock) -> None:
    fences = []
    for _ in range(10):
        lease = lock.acquire()
        assert lease is not None
        fences.append(lease.fence)
        lease.release()
        r.delete(lock.keys.fence)  # e.g. evicted, or a failover lost it
    assert all(b > a for a, b in itertools.pairwise(fences))


def test_fence_counter_ahead_of_the_clock_still_increases(r: redis.Redis, lock: RedisLock) -> None:
    r.set(lock.keys.fence, 9_000_000_000_000_000)  # far ahead of the µs clock
    lease = lock.acquire()
    assert lease is not None and lease.fence == 9_000_000_000_000_001
    assert r.pttl(lock.keys.fence) > lock_module.FENCE_MEMORY_MS - 60_000
    lease.release()
    lease = lock.acquire()
    assert lease is not None and lease.fence == 9_000_000_000_000_002
    lease.release()


def test_fence_key_expires_by_itself(r: redis.Redis, lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None
    memory = lock_module.FENCE_MEMORY_MS  # written into the script's text
    assert memory - 60_000 < r.pttl(lock.keys.fence) <= memory
    lease.release()


# -- context manager ------------------------------------------------------------------


def test_with_block_holds_and_releases(r: redis.Redis, lock: RedisLock) -> None:
    with lock as lease:
        assert isinstance(lease, Lease)
        assert lock.locked() and holder_tokens(r, lock) == {lease.token}
    assert lease.released and not lease.lost
    assert not lock.locked()


def test_with_block_releases_on_exception(lock: RedisLock) -> None:
    with pytest.raises(KeyError), lock as lease:
        raise KeyError("boom")
    assert lease.released
    assert not lock.locked()


def test_with_block_after_explicit_release_is_quiet(lock: RedisLock) -> None:
    with lock as lease:
        assert lease.release()
    assert not lock.locked()


def test_leaving_with_block_of_a_lost_lease_raises(r: redis.Redis) -> None:
    lock = RedisLock(r, "lost", ttl=0.05)
    with pytest.raises(LockNotOwned) as error, lock as lease:
        time.sleep(0.08)
    assert error.value.name == "lost" and error.value.token == lease.token
    assert error.value.__cause__ is None
    assert lease.lost


def test_lost_with_block_is_chained_to_the_blocks_exception(r: redis.Redis) -> None:
    lock = RedisLock(r, "lost", ttl=0.05)
    with pytest.raises(LockNotOwned) as error, lock:
        time.sleep(0.08)
        raise ZeroDivisionError("inside")
    cause = error.value.__cause__
    assert isinstance(cause, ZeroDivisionError) and str(cause) == "inside"


def test_lost_with_block_does_not_release_the_new_holder(r: redis.Redis) -> None:
    lock = RedisLock(r, "taken", ttl=0.05)
    other = RedisLock(r, "taken", ttl=5)
    with pytest.raises(LockNotOwned), lock:
        time.sleep(0.08)
        thief = other.acquire(blocking=False)
        assert thief is not None
    assert lock.locked() and holder_tokens(r, lock) == {thief.token}
    assert thief.release()


def test_lease_as_context_manager(lock: RedisLock) -> None:
    lease = lock.acquire()
    assert lease is not None
    with lease as same:
        assert same is lease
    assert lease.released and not lock.locked()


# -- adopt ----------------------------------------------------------------------------


def test_adopt_hands_a_live_lease_over(r: redis.Redis, lock: RedisLock) -> None:
    old = lock.acquire()
    assert old is not None
    new = lock.adopt(old.token)
    assert new is not None and new.token != old.token and new.fence > old.fence
    assert holder_tokens(r, lock) == {new.token}
    assert old.release() is False  # handed over: no longer ours
    assert lock.adopt(old.token) is None  # only once
    assert lock.locked()
    assert new.release() is True
    assert not lock.locked()


def test_adopt_of_an_expired_or_unknown_token_is_none(r: redis.Redis) -> None:
    lock = RedisLock(r, "adopt", ttl=0.05)
    old = lock.acquire()
    assert old is not None
    time.sleep(0.08)
    assert lock.adopt(old.token) is None
    assert lock.adopt("0" * 32) is None
    assert not lock.locked()
    with pytest.raises(ConfigurationError):
        lock.adopt("")


# -- fork safety ------------------------------------------------------------------------


def run_in_child(body: Any) -> int:
    """Fork; run ``body()`` in the child, whose return value is its exit code."""
    with warnings.catch_warnings():  # 3.12+: fork of a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            code = int(body())
        finally:
            os._exit(code)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("forked child hung")


def test_forked_child_cannot_release_or_extend_the_parents_lease(
    r: redis.Redis, lock: RedisLock
) -> None:
    lease = lock.acquire()
    assert lease is not None

    def child() -> int:
        other = lock.acquire(ttl=0.01, blocking=False, owner="x")  # refused, but a token
        checks = [
            other is None,
            primitive_module.fresh_token()[1] != lease.token.rsplit(".", 1)[1],  # a tag of its own
            lease.release() is False,
            lease.extend(60) is False,
            lease.lost,
            lock.acquire(blocking=False) is None,  # the child may use the lock itself
        ]
        return sum(1 << i for i, ok in enumerate(checks) if not ok)

    assert run_in_child(child) == 0
    assert lock.locked() and holder_tokens(r, lock) == {lease.token}
    assert r.pttl(lock.keys.holders) <= 30_000  # not extended to 60 s by the child
    assert not lease.lost
    assert lease.release() is True


def test_forked_child_leaving_a_with_block_does_not_release(r: redis.Redis) -> None:
    lock = RedisLock(r, "fork-with", ttl=30)
    lease = lock.acquire()
    assert lease is not None

    def child() -> int:
        try:
            with lease:
                pass
        except LockNotOwned:
            return 0
        return 1

    assert run_in_child(child) == 0
    assert holder_tokens(r, lock) == {lease.token}
    assert lease.release()
