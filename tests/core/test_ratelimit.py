"""RedisRateLimiter on a real redis-server: rates parsed and checked, all-or-nothing
over several rates, retry_after, blocking with a timeout, penalty, adjust, override,
reset, and a limiter whose state was lost (issue #25)."""

from __future__ import annotations

import re
import time

import pytest
import redis

from celery_redislock import ConfigurationError, RateLimited, RedisLockError, RedisRateLimiter
from celery_redislock.core.ratelimit import limiter_names
from celery_redislock.core.ratelimit_rates import parse_rates
from celery_redislock.testing import RedisServer


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [("10/s", 10, 1.0), ("5/10s", 5, 10.0), ("1000/15m", 1000, 900.0), (" 3 / h ", 3, 3600.0)],
)
def test_rates_parse(text: str, limit: int, period: float) -> None:
    (rate,) = parse_rates(text)
    assert (rate.limit, rate.period) == (limit, period)


@pytest.mark.parametrize(
    "bad", ["abc", "0/s", "-1/s", "10/x", "", "10/0s", "1.5/s", [], ["10/s", 5], None, 10]
)
def test_bad_rates_name_the_option_and_the_value(r: redis.Redis, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^rate must .*" + re.escape(repr(bad))):
        RedisRateLimiter(r, "api", rate=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="global_rate_limit"):
        parse_rates(bad, "global_rate_limit")


@pytest.mark.parametrize("cost", [0, -1, 1.5, True, "1"])
def test_bad_costs_are_refused(r: redis.Redis, cost: object) -> None:
    limiter = RedisRateLimiter(r, "api", rate="10/s")
    with pytest.raises(ConfigurationError, match=r"^cost must .*got " + re.escape(repr(cost))):
        limiter.acquire(cost)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cost"):
        limiter.retry_after(cost)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cost must be at most the smallest limit"):
        limiter.acquire(11)


def test_keys_share_one_hash_tag(r: redis.Redis) -> None:
    RedisRateLimiter(r, "a{b}", rate="1/s", prefix="p").acquire()
    assert sorted(r.keys("*")) == [b"p:ratelimit:{a%7Bb%7D}:log", b"p:ratelimit:{a%7Bb%7D}:state"]


def test_n_per_period_then_refused_until_the_window_moves(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="5/s")
    assert all(limiter.acquire(blocking=False) for _ in range(5))
    assert not limiter.acquire(blocking=False)
    first = limiter.last_admission
    assert first is not None
    wait = limiter.retry_after()
    assert 0.9 < wait <= 1.001 + 0.001  # a period after the first admission (1 ms slots)
    assert limiter.retry_after() <= wait  # retry_after charges nothing


def test_several_rates_admit_all_or_nothing(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate=["5/s", "2/10s"])
    assert limiter.acquire(blocking=False) and limiter.acquire(blocking=False)
    for _ in range(3):  # refused by "2/10s": "5/s" is not charged either
        assert not limiter.acquire(blocking=False)
    used = {usage.period: usage.used for usage in limiter.info().active}
    assert used == {1.0: 2, 10.0: 2}
    assert 9.0 < limiter.retry_after() <= 10.01
    # With cost: 2 of "3/s" left after one, so a cost of 2 fits, 3 does not.
    other = RedisRateLimiter(r, "tokens", rate=["3/s", "100/m"])
    assert other.acquire(1, blocking=False)
    assert not other.acquire(3, blocking=False)
    assert other.acquire(2, blocking=False)
    assert [u.used for u in other.info().active] == [3, 3]


def test_blocking_sleeps_until_the_admission_time_or_gives_up(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="2/s")
    assert limiter.acquire() and limiter.acquire()
    started = time.monotonic()
    assert not limiter.acquire(timeout=0.3)  # the admission is ~1 s away: at once
    assert time.monotonic() - started < 0.2
    assert limiter.acquire(timeout=5)
    assert 0.8 < time.monotonic() - started < 2.5
    calls = r.info("commandstats")["cmdstat_evalsha"]["calls"]
    limiter.acquire()  # one more wait of ~1 s: slept, not polled
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] - calls <= 3


def test_penalize_holds_everyone_then_resumes(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="100/s")
    other = RedisRateLimiter(redis.Redis(connection_pool=r.connection_pool), "api", rate="100/s")
    end = limiter.penalize(0.5)
    assert end - float(r.time()[0]) < 1.5
    assert not other.acquire(blocking=False)
    assert 0.3 < other.retry_after() <= 0.5
    assert limiter.penalize(0.1) == end  # a longer penalty stays
    assert 0.3 < limiter.info().penalty_left <= 0.5
    started = time.monotonic()
    assert other.acquire()
    assert time.monotonic() - started > 0.3
    admitted = other.last_admission
    assert admitted is not None and admitted.at >= end


def test_adjust_corrects_the_last_admission(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "tokens", rate="10/s")
    with pytest.raises(ConfigurationError, match="admission must be given"):
        limiter.adjust(-1)
    assert limiter.acquire(4)
    assert limiter.adjust(-3) == -3
    assert [u.used for u in limiter.info().active] == [1]
    assert limiter.adjust(+5) == 5
    assert [u.used for u in limiter.info().active] == [6]
    admission = limiter.last_admission
    assert limiter.acquire(2)
    assert limiter.adjust(-100, admission) == -6  # never more than it was charged: 4 - 3 + 5
    assert [u.used for u in limiter.info().active] == [2]
    with pytest.raises(ConfigurationError, match="delta"):
        limiter.adjust(0)


def test_override_replaces_the_rate_for_its_ttl(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="2/s")
    limiter.override("5/s", 0.4)
    info = limiter.info()
    assert info.override == "5/s" and 0.3 < info.override_left <= 0.4
    assert [(u.limit, u.period) for u in info.active] == [(5, 1.0)]
    assert sum(limiter.acquire(blocking=False) for _ in range(6)) == 5
    time.sleep(0.45)
    info = limiter.info()
    assert info.override is None and [(u.limit, u.used) for u in info.active] == [(2, 5)]
    assert not limiter.acquire(blocking=False)  # the configured rate counted meanwhile
    limiter.override(["1/s"], 10)
    limiter.clear_override()
    assert limiter.info().override is None
    with pytest.raises(ConfigurationError, match="rate must"):
        limiter.override("1/x", 10)
    with pytest.raises(ConfigurationError, match="ttl must"):
        limiter.override("1/s", 0)


def test_reset_admits_at_once(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="1/h")
    assert limiter.acquire(blocking=False)
    limiter.penalize(100)
    assert limiter.retry_after() > 99
    limiter.reset()
    assert limiter.acquire(blocking=False)


def test_reset_keeps_the_override_and_the_stored_rates(r: redis.Redis) -> None:
    """A reset forgets charges and penalty, not what was configured: an operator's
    override holds on, and the limiter is still found by its name alone (the CLI,
    the workers' pumps) -- its stored rates were dropped, and attach() said None."""
    limiter = RedisRateLimiter(r, "api", rate=["10/s", "100/h"])
    assert limiter.acquire(blocking=False)
    limiter.override("1/m", ttl=60)
    assert limiter.acquire(blocking=False) and not limiter.acquire(blocking=False)
    limiter.reset()
    attached = RedisRateLimiter.attach(r, "api")
    assert attached is not None and [rate.text for rate in attached.rates] == ["10/s", "100/h"]
    info = attached.info()
    assert info.override == "1/m" and 0 < info.override_left <= 60
    assert info.rates == ("10/s", "100/h") and info.wait == 0.0
    assert attached.acquire(blocking=False) and not attached.acquire(blocking=False)
    limiter.clear_override()
    assert limiter.acquire(blocking=False)


def test_memory_is_bounded_by_slots_not_by_n(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "tokens", rate="90000/m", slots=20)
    for _ in range(300):
        assert limiter.acquire(7, blocking=False)
    log = "redislock:ratelimit:{tokens}:log"
    assert r.zcard(log) <= 21 and r.hlen("redislock:ratelimit:{tokens}:state") <= 2 * 21 + 2
    assert [u.used for u in limiter.info().active] == [2100]


def test_a_limiter_whose_state_was_lost_starts_spent(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        limiter = RedisRateLimiter(client, "api", rate="3/2s")
        opted_out = RedisRateLimiter(client, "free", rate="3/2s", start_spent=False)
        assert limiter.acquire(blocking=False) and opted_out.acquire(blocking=False)
        server.restart()  # empty: no persistence
        assert client.dbsize() == 0
        with caplog.at_level("WARNING", "celery_redislock.core.ratelimit_scripts"):
            assert not limiter.acquire(blocking=False)  # no fresh burst after the loss
        (record,) = caplog.records  # reported once, by the call that found it
        assert "'api': its state in Redis was lost" in record.getMessage()
        assert 1.9 < limiter.retry_after() <= 2.01
        with caplog.at_level("WARNING", "celery_redislock.core.ratelimit_scripts"):
            assert opted_out.acquire(blocking=False)  # start_spent=False
        assert "start_spent=False: not charged" in caplog.records[-1].getMessage()
        # A new limiter object on the same client knows the state was seen.
        assert not RedisRateLimiter(client, "api", rate="3/2s").acquire(blocking=False)
        # Reset clears the charge and keeps the loss marker: no second "loss".
        limiter.reset()
        assert limiter.acquire(blocking=False)
        # A client that never saw the limiter cannot tell a loss from a new one.
        fresh = redis.Redis.from_url(server.url)
        assert RedisRateLimiter(fresh, "new", rate="1/s").acquire(blocking=False)
        client.close()
        fresh.close()


def test_rate_limited_is_ours_and_pickles() -> None:
    import pickle

    error = RateLimited(retry_after=2.5)
    assert isinstance(error, RedisLockError) and error.retry_after == 2.5
    again = pickle.loads(pickle.dumps(error))
    assert again.retry_after == 2.5 and str(again) == str(error)


def test_a_resent_adjust_moves_nothing_again(r: redis.Redis) -> None:
    from celery_redislock.core.ratelimit_scripts import ADJUST

    limiter = RedisRateLimiter(r, "tokens", rate="10/s")
    assert limiter.acquire(5)
    call = limiter._scripts.adjust_call(-2, None)
    assert call.script is ADJUST
    assert ADJUST(r, call.keys, call.args) == -2
    assert ADJUST(r, call.keys, call.args) == -2  # redis-py re-sending after a lost reply
    assert [u.used for u in limiter.info().active] == [3]


def test_a_tool_attaches_to_a_limiter_by_its_name(r: redis.Redis) -> None:
    assert RedisRateLimiter.attach(r, "api") is None  # no state: nothing to show
    RedisRateLimiter(r, "x{*}", rate="1/s").acquire()
    RedisRateLimiter(r, "other", rate="1/s", prefix="p*").acquire()
    used = RedisRateLimiter(r, "api", rate=["10/s", "500/m", "3/90s", "1/d"])
    assert used.acquire(blocking=False)
    found = RedisRateLimiter.attach(r, "api")
    assert found is not None
    assert [rate.text for rate in found.rates] == ["10/s", "500/m", "3/90s", "1/d"]
    info = found.info()
    assert info.rates == ("10/s", "500/m", "3/90s", "1/d")
    assert [u.used for u in info.active] == [1, 1, 1, 1]
    found.override("1/s", 5)  # what the CLI does
    assert used.info().override == "1/s"
    assert limiter_names(r) == ["api", "x{*}"]
    assert limiter_names(r, prefix="p*") == ["other"]


def test_both_keys_expire_together_a_day_after_the_last_call(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate=["5/s", "1/h"])
    assert limiter.acquire(blocking=False)
    log, state = "redislock:ratelimit:{api}:log", "redislock:ratelimit:{api}:state"
    day = 86_400_000
    for key in (log, state):  # the log must never expire before the state's totals
        assert day + 3_600_000 - 1000 <= r.pttl(key) <= day + 3_600_000 + 3_600_000
    limiter.reset()  # the log is gone; the next admission makes it with an expiry
    assert limiter.acquire(blocking=False)
    assert r.pttl(log) >= r.pttl(state) - 1000


def test_the_limiter_never_reads_a_client_clock() -> None:
    # Decisions are the scripts' (Redis's TIME); the client only measures durations
    # to sleep (time.monotonic). The process tests shift time.time by an hour.
    from pathlib import Path

    import celery_redislock

    root = Path(celery_redislock.__file__).parent
    for path in [*root.glob("core/ratelimit*.py"), root / "asyncio" / "ratelimit.py"]:
        source = path.read_text("utf-8")
        assert "time.time" not in source and "datetime" not in source, path


def test_another_script_admits_by_the_library(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the Celery side's parking scripts do with lib_ratelimit.lua: "when is the
    # next admission for cost c" and "admit and charge now", inside their own script.
    from celery_redislock.core import lua_text
    from celery_redislock.core.scripts import LuaScript

    text = """--!include lib_ratelimit.lua
local log, state = KEYS[1], KEYS[2]
local cost, slots = tonumber(ARGV[5]), tonumber(ARGV[2])
local now = rl_now()
local active, charged, lost, keep =
  rl_prepare(log, state, ARGV[1], slots, tonumber(ARGV[3]), tonumber(ARGV[4]), now)
local at = rl_when(log, state, active, cost, now)
if at > now then return {0, at - now, keep} end
return {1, rl_charge(log, state, charged, cost, slots, now), keep}
"""
    read = lua_text._read
    monkeypatch.setattr(lua_text, "_read", lambda name: text if name == "t.lua" else read(name))
    script = LuaScript("t.lua")
    limiter = RedisRateLimiter(r, "api", rate="3/s")
    scripts = limiter._scripts
    assert limiter.acquire(2)
    admitted, id_, keep = script(r, scripts.keys, [*scripts.lib_args(), 1])
    assert admitted == 1 and id_.startswith(b"1000000:")
    scripts.kept(keep)
    admitted, wait_us, _ = script(r, scripts.keys, [*scripts.lib_args(), 1])
    assert admitted == 0 and 900_000 < wait_us <= 1_001_000
    assert not limiter.acquire(blocking=False)  # one limit for both


def test_a_long_penalty_does_not_let_the_log_expire_first(r: redis.Redis) -> None:
    limiter = RedisRateLimiter(r, "api", rate="5/s")
    limiter.penalize(3 * 86_400)  # the state is kept 3 days
    limiter.reset()  # the log is gone, the state stays
    assert limiter.acquire(blocking=False)
    log = "redislock:ratelimit:{api}:log"
    r.pexpire(log, 10_000)  # as if a day had passed since the log was made
    limiter.retry_after()  # any call renews the log's expiry
    assert r.pttl(log) > 86_400_000


def test_refunds_of_one_admission_never_exceed_what_it_was_charged(r: redis.Redis) -> None:
    # slots=1: every admission of a period shares one slot (as many do on a busy
    # limiter), so a refund bounded by the slot's charge alone could give back another
    # admission's units and let more than N through in one period.
    limiter = RedisRateLimiter(r, "tokens", rate="10/s", slots=1)
    assert limiter.acquire(5)
    first = limiter.last_admission
    assert limiter.acquire(5)
    assert limiter.adjust(-3, first) == -3
    assert limiter.adjust(-3, first) == -2  # 2 left of its 5
    assert limiter.adjust(-3, first) == 0
    assert [u.used for u in limiter.info().active] == [5]
    assert not limiter.acquire(6, blocking=False)  # still 10 per period, not 15
    # An extra charge is refundable too, but again never beyond the admission's own.
    assert limiter.adjust(+4, first) == 4
    assert limiter.adjust(-9, first) == -4
    assert [u.used for u in limiter.info().active] == [5]
