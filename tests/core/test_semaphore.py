"""RedisSemaphore: each script's contract on a real redis-server (one process)."""

from __future__ import annotations

import logging
import math
import time

import pytest
import redis

from celery_redislock import ConfigurationError, LockNotOwned, RedisSemaphore
from celery_redislock.core.scripts import as_text


def test_grants_up_to_limit_then_refuses(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=2, ttl=5)
    a, b = sem.acquire(blocking=False), sem.acquire(blocking=False)
    assert a is not None and b is not None
    assert sem.acquire(blocking=False) is None
    assert sem.acquire(timeout=0) is None
    assert sem.available() == 0
    assert a.release()
    assert sem.available() == 1
    c = sem.acquire(blocking=False)
    assert c is not None and c.fence > b.fence > a.fence


def test_with_block_releases_and_reports_a_lost_lease(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    with sem as lease:
        assert sem.available() == 0 and lease.fence > 0
    assert sem.available() == 1
    with pytest.raises(LockNotOwned), sem as lease:
        r.zrem(sem.keys.holders, lease.token)  # taken away behind our back


def test_resent_acquire_holds_one_permit(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=3)
    first = sem._attempt("tok", "", 5000, False)
    again = sem._attempt("tok", "", 5000, False)
    assert first[0] == again[0] == 1 and first[1] == again[1]
    assert r.zcard(sem.keys.holders) == 1 and sem.available() == 2


def test_double_unknown_and_expired_release_change_nothing(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=3, ttl=5)
    keep = sem.acquire()
    lease = sem.acquire()
    short = sem.acquire(ttl=0.05)
    assert keep and lease and short
    assert lease.release() is True
    assert lease.release() is False  # the lease knows it gave up
    assert sem._release_token(lease.token) is True  # a re-sent release: answered as the first
    assert sem._release_token("not-a-token") is False
    time.sleep(0.1)  # let `short` expire on the server's clock
    assert short.release() is False and short.lost
    assert [h.token_hint for h in sem.info().holders] == [keep.token[:8]]
    assert sem.available() == 2


def test_extend_never_revives_an_expired_permit(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, ttl=0.1)
    lease = sem.acquire()
    assert lease is not None
    assert lease.extend(5) and 4.9 < sem.info().ttl_left <= 5
    assert lease.extend(0.2)  # a reply later than 0.2 s would be no confirmation
    time.sleep(0.25)
    assert lease.extend(5) is False and lease.lost
    assert r.zscore(sem.keys.holders, lease.token) is None and sem.available() == 1


def test_expired_holder_is_reaped_and_its_permit_passes_on(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    assert sem.acquire(ttl=0.2) is not None  # never released: as if its holder crashed
    start = time.monotonic()
    lease = sem.acquire(timeout=3)
    assert lease is not None and 0.1 < time.monotonic() - start < 0.6


def test_info_shows_holders_owner_ttl_and_waiters(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=2, ttl=10)
    assert sem.info().held is False and sem.info().limit == 2
    a = sem.acquire(owner="task-1")
    b = sem.acquire(ttl=2)
    assert a and b
    sem._attempt("waiter", "", 1000, True)
    info = sem.info()
    assert info.kind == "semaphore" and info.limit == 2 and info.waiters == 1
    by_hint = {h.token_hint: h for h in info.holders}
    assert by_hint[a.token[:8]].owner == "task-1" and by_hint[a.token[:8]].fence == a.fence
    assert 9 < by_hint[a.token[:8]].ttl_left <= 10 and 1 < by_hint[b.token[:8]].ttl_left <= 2
    assert info.fence == b.fence and info.since is not None


def test_a_client_clock_off_by_an_hour_changes_nothing(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = time.time
    for skew in (3600.0, -3600.0):
        monkeypatch.setattr(time, "time", lambda skew=skew: real() + skew)
        sem = RedisSemaphore(r, f"skew{skew}", limit=1, ttl=0.5)
        lease = sem.acquire()
        assert lease is not None and not lease.lost
        assert 0.25 < sem.info().ttl_left <= 0.5
        assert sem.acquire(blocking=False) is None  # held: not expired by the skew
        assert sem.acquire(timeout=3) is not None  # granted once the 0.5 s pass


def test_noscript_is_recovered(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, ttl=5)
    r.script_flush()
    lease = sem.acquire()
    assert lease is not None
    r.script_flush()
    assert sem.acquire(blocking=False) is None
    r.script_flush()
    assert lease.extend()
    r.script_flush()
    assert sem.info().held
    r.script_flush()
    assert lease.release() and sem.available() == 1


def test_lowered_limit_never_revokes_and_waits_below_it(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    old = RedisSemaphore(r, "s", limit=3, ttl=5)
    leases = [old.acquire(blocking=False) for _ in range(3)]
    assert all(leases)
    new = RedisSemaphore(r, "s", limit=2, ttl=5)
    with caplog.at_level(logging.WARNING, "celery_redislock"):
        assert new.acquire(blocking=False) is None
    assert "limit=2" in caplog.text
    assert new.info().limit == 2 and new.available() == 0
    assert all(lease.extend() for lease in leases if lease)  # nobody revoked
    assert leases[0] and leases[0].release()
    assert new.acquire(blocking=False) is None  # 2 live, limit 2
    assert leases[1] and leases[1].release()
    assert new.acquire(blocking=False) is not None
    raised = RedisSemaphore(r, "s", limit=4, ttl=5)
    assert raised.acquire(blocking=False) is not None and raised.info().limit == 4


def test_renewal_keeps_a_permit_and_max_hold_ends_it(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1, ttl=0.3, renew=True)
    lease = sem.acquire()
    assert lease is not None
    assert not lease.wait_lost(1.0)  # three TTLs later, still ours
    assert sem.available() == 0 and 0 < sem.info().ttl_left <= 0.3  # live, never past its TTL
    assert lease.release() and sem.available() == 1
    capped = sem.acquire(max_hold=0.5)
    assert capped is not None and capped.wait_lost(3) and "max_hold" in capped.lost_reason
    # The client declares the lease lost at its own conservative instant (measured from
    # before the grant was sent); the server's copy may outlive it by a round trip.
    # Renewal has stopped, so the permit frees within one TTL (0.3 s): wait for that.
    deadline = time.monotonic() + 2.0
    while sem.available() != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sem.available() == 1


def test_brace_names_share_one_hash_tag(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "pool {a}}", limit=1)
    with sem:
        tags = {as_text(key).split("}")[0] for key in r.keys("*")}
        assert tags == {"redislock:semaphore:{pool %7Ba%7D%7D"}


@pytest.mark.parametrize(
    ("options", "argument", "value"),
    [
        ({"limit": 0}, "limit", "0"),
        ({"limit": -1}, "limit", "-1"),
        ({"limit": 1.5}, "limit", "1.5"),
        ({"limit": "3"}, "limit", "'3'"),
        ({"limit": True}, "limit", "True"),
        ({"limit": None}, "limit", "None"),
        ({"limit": 1, "ttl": 0}, "ttl", "0"),
        ({"limit": 1, "ttl": -1}, "ttl", "-1"),
        ({"limit": 1, "ttl": math.nan}, "ttl", "nan"),
        ({"limit": 1, "ttl": math.inf}, "ttl", "inf"),
        ({"limit": 1, "ttl": "30"}, "ttl", "'30'"),
        ({"limit": 1, "fair": "yes"}, "fair", "'yes'"),
        ({"limit": 1, "renew": 1}, "renew", "1"),
    ],
)
def test_bad_arguments_are_refused_at_construction(
    r: redis.Redis, options: dict[str, object], argument: str, value: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{argument} .*got {value}"):
        RedisSemaphore(r, "s", **options)  # type: ignore[arg-type]


def test_bad_names_clients_and_acquire_arguments(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="name"):
        RedisSemaphore(r, "", limit=1)
    with pytest.raises(ConfigurationError, match="client"):
        RedisSemaphore("redis://", "s", limit=1)
    sem = RedisSemaphore(r, "s", limit=1)
    for call in ({"timeout": -1}, {"ttl": 0}, {"owner": ""}):
        with pytest.raises(ConfigurationError):
            sem.acquire(**call)


def test_keys_outlive_the_longest_lease_and_are_rewritten_only_when_due(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=3, ttl=5)
    leases = [sem.acquire()]
    keys = (sem.keys.holders, sem.keys.leases)
    for key in keys:  # a second beyond the lease: the next grants need not write
        assert 5000 < r.pttl(key) <= 6000
        r.pexpire(key, 5500)
    leases.append(sem.acquire())
    for key in keys:  # long enough for the new lease already: left alone
        assert 5000 < r.pttl(key) <= 5500
        r.pexpire(key, 4000)
    leases.append(sem.acquire())
    for key in keys:  # too short for the new lease: set past it again
        assert 5000 < r.pttl(key) <= 6000
    assert all(leases)


def test_a_refusal_after_reaping_answers_the_earliest_live_lease(r: redis.Redis) -> None:
    wide = RedisSemaphore(r, "s", limit=3)
    leases = [wide.acquire(ttl=0.05), wide.acquire(ttl=5), wide.acquire(ttl=3)]
    assert all(leases)
    time.sleep(0.1)
    narrow = RedisSemaphore(r, "s", limit=2)  # two live leases: full once reaped
    granted, wait_ms, _, _ = narrow._attempt("x" * 32, "", 1000, False)
    assert granted == 0 and 2700 < wait_ms <= 3000  # the 3 s lease, not the reaped one
    assert r.zcard(narrow.keys.holders) == 2 and not r.exists(narrow.keys.queue)
