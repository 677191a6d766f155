"""``celery redislock rates``: each limiter's rates, next admission, parked runs; a
temporary rate set, shown and cleared without a deploy (#25)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redislock import RedisRateLimiter
from celery_redislock.celery.cli import redislock
from celery_redislock.core.parking import ParkingQueue, RateCapacity, new_entry_id

from ..workers import LOCKS_DB, db_url


@pytest.fixture
def app(redis_url: str, locks: redis.Redis) -> Iterator[Celery]:
    app = Celery("cli-rates", set_as_current=False)
    app.conf.update(redislock_url=db_url(redis_url, LOCKS_DB))
    yield app
    app.close()


def _invoke(app: Celery, *args: str) -> Result:
    return CliRunner().invoke(
        redislock, list(args), obj=CLIContext(app=app, no_color=True, workdir=None)
    )


def test_rates_lists_each_limiter_and_its_parked_runs(app: Celery, locks: redis.Redis) -> None:
    limiter = RedisRateLimiter(locks, "openai", rate=["2/s", "100/m"])
    assert limiter.acquire(blocking=False) and limiter.acquire(blocking=False)
    queue = ParkingQueue(RateCapacity(locks, "openai", rate=["2/s", "100/m"]), reserve_ttl=30)
    assert queue.park(new_entry_id(), b"run", owner="t1") == 1
    result = _invoke(app, "rates", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["name"] == "openai" and row["rates"] == ["2/s", "100/m"]
    assert row["parked"] == 1 and row["oldest_wait"] is not None
    assert 0 < row["next"] <= 1.0 and row["override"] is None
    table = _invoke(app, "rates")
    assert table.exit_code == 0 and "openai" in table.output and "2/s, 100/m" in table.output


def test_a_temporary_rate_is_set_shown_and_cleared(app: Celery, locks: redis.Redis) -> None:
    limiter = RedisRateLimiter(locks, "api", rate="10/s")
    limiter.acquire()
    result = _invoke(app, "rates", "api", "--set", "1/m", "--for", "60", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["override"] == "1/m" and 0 < row["override_left"] <= 60
    assert limiter.acquire(blocking=False)  # every worker admits one a minute now
    (row,) = json.loads(_invoke(app, "rates", "api", "--json").output)
    assert row["next"] > 1 and not limiter.acquire(blocking=False)
    (row,) = json.loads(_invoke(app, "rates", "api", "--clear", "--json").output)
    assert row["override"] is None and row["next"] == 0.0


def test_a_reset_forgets_the_charges_and_keeps_the_temporary_rate(
    app: Celery, locks: redis.Redis
) -> None:
    """The CLI's reset is the API's: charges and penalty go, an operator's temporary
    rate stays (``--clear`` ends it), and the limiter is still listed by its name."""
    limiter = RedisRateLimiter(locks, "api", rate="2/m")
    assert limiter.acquire(blocking=False) and limiter.acquire(blocking=False)
    assert _invoke(app, "rates", "api", "--set", "1/h", "--for", "600").exit_code == 0
    limiter.penalize(100)
    result = _invoke(app, "rates", "api", "--reset", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["override"] == "1/h" and row["next"] == 0.0 and row["penalty_left"] == 0.0
    assert row["rates"] == ["2/m"]
    limiter.reset()
    listed = _invoke(app, "rates", "--json")  # found by its name after the API's reset too
    assert listed.exit_code == 0 and [row["name"] for row in json.loads(listed.output)] == ["api"]
    (row,) = json.loads(_invoke(app, "rates", "api", "--json").output)
    assert row["override"] == "1/h" and row["rates"] == ["2/m"]
    assert limiter.acquire(blocking=False) and not limiter.acquire(blocking=False)  # 1/h
    (row,) = json.loads(_invoke(app, "rates", "api", "--reset", "--clear", "--json").output)
    assert row["override"] is None and row["next"] == 0.0
    assert _invoke(app, "rates", "--reset").exit_code == 2  # needs a NAME


def test_a_bad_rate_or_an_unknown_limiter_is_refused(app: Celery, locks: redis.Redis) -> None:
    RedisRateLimiter(locks, "api", rate="10/s").acquire()
    bad = _invoke(app, "rates", "api", "--set", "0/s")
    assert bad.exit_code == 2 and "0/s" in bad.output
    assert _invoke(app, "rates", "nope").exit_code == 3


def test_inspect_of_a_rate_limiters_name_points_at_rates(app: Celery, locks: redis.Redis) -> None:
    """A new user's ``inspect crm-api`` (their global_rate_key): before, "no lock or
    semaphore named 'crm-api' is held or waited for" although the limiter exists."""
    RedisRateLimiter(locks, "crm-api", rate="5/s").acquire()
    result = _invoke(app, "inspect", "crm-api")
    assert result.exit_code == 3, result.output
    assert "'crm-api' is a rate limiter" in result.output, result.output
    assert "celery redislock rates crm-api" in result.output, result.output
    unknown = _invoke(app, "inspect", "nothing-here")
    assert unknown.exit_code == 3 and "rate limiter" not in unknown.output, unknown.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # before: "Invalid value for --set: ttl must be a finite number of seconds > 0"
        (["--set", "2/s", "--for", "0"], ["--for", "0"]),
        (["--set", "2/s", "--for", "inf"], ["--for", "inf"]),
        # before: exit 0, --for ignored without a word
        (["--for", "10"], ["--for", "--set"]),
        # before: exit 0, --clear ignored (the rate set)
        (["--set", "2/s", "--clear"], ["--set", "--clear"]),
        # before: "Invalid value for --set: rate must be a rate ..., got '2/sec' (in ['2/sec'])"
        (["--set", "2/sec"], ["--set: RATE must be a rate", "got '2/sec'"]),
        (["--set", "2/s,9/x"], ["--set: RATE must be a rate", "got '9/x' (in ['2/s', '9/x'])"]),
    ],
)
def test_rates_refuses_options_that_do_not_go_together_naming_them(
    app: Celery, locks: redis.Redis, args: list[str], says: list[str]
) -> None:
    """A new user's mistakes with ``rates NAME``: each is a usage error (exit 2) naming
    the option (and its value), and the limiter is left as it was."""
    limiter = RedisRateLimiter(locks, "crm-api", rate="5/s")
    limiter.acquire()
    result = _invoke(app, "rates", "crm-api", *args)
    assert result.exit_code == 2, result.output
    error = result.output.splitlines()[-1]
    assert all(word in error for word in says), error
    assert "ttl" not in error and "(in ['2/sec'])" not in error, error
    assert limiter.info().override is None
