"""The parking settings (``redislock_park_keep``, ``redislock_park_sweep_interval``) and
the sweeper's lease time: a bad value raises ConfigurationError naming the setting and
the value where it is read (no Redis needed: clients connect lazily)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from celery import Celery

import celery_redislock.celery.bounded.sweeper as sweeper_module
from celery_redislock.celery.bounded.journal import journal_for
from celery_redislock.celery.bounded.parking import parking_for
from celery_redislock.celery.bounded.settings import (
    DEFAULT_KEEP,
    DEFAULT_SWEEP_INTERVAL,
    park_keep,
    sweep_interval,
)
from celery_redislock.celery.config import restart_grace
from celery_redislock.errors import ConfigurationError

BAD = ["a day", None, True, 0, -1, float("nan"), float("inf"), [86400]]


def _naming(setting: str, value: object) -> str:
    return f"{setting} .*got {re.escape(repr(value))}"


@pytest.fixture
def app(app: Celery) -> Celery:
    # A journal on a Redis of its own, so journal_for reads the keep time too.
    app.conf.update(broker_url="redis://h:6379/1", redislock_url="redis://locks:6379/0")
    return app


def test_defaults_and_good_values(app: Celery) -> None:
    assert (park_keep(app), sweep_interval(app)) == (DEFAULT_KEEP, DEFAULT_SWEEP_INTERVAL)
    app.conf.update(redislock_park_keep=3600, redislock_park_sweep_interval=0.25)
    assert (park_keep(app), sweep_interval(app)) == (3600.0, 0.25)
    assert parking_for(app, "pool", 2, 30.0, "redislock")._keep_ms == 3_600_000


def _parking(app: Celery) -> object:
    return parking_for(app, "pool", 2, 30.0, "redislock")


def noop() -> None:
    """A task body."""


def _worker_ready(app: Celery) -> None:
    # What the worker_ready signal calls; a bounded task makes the worker sweep.
    app.task(concurrency_limit=1)(noop)
    sweeper_module.SWEEPERS.start(app)


KEEP, INTERVAL = "redislock_park_keep", "redislock_park_sweep_interval"


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize(
    ("setting", "read"),
    [
        (KEEP, park_keep),
        (KEEP, _parking),
        (KEEP, journal_for),
        (INTERVAL, sweep_interval),
        (INTERVAL, _worker_ready),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(
    app: Celery, setting: str, read: Callable[[Celery], object], value: object
) -> None:
    app.conf[setting] = value
    with pytest.raises(ConfigurationError, match=_naming(setting, value)):
        read(app)
    assert sweeper_module.SWEEPERS.running(app) is None  # no sweeper started


def test_the_sweep_reads_the_lease_time_checked(app: Celery) -> None:
    app.conf.redislock_lock_ttl = "30"
    with pytest.raises(ConfigurationError, match=_naming("redislock_lock_ttl", "30")):
        sweeper_module.sweep(app)  # before any Redis call


def test_restart_grace_setting(app: Celery) -> None:
    assert restart_grace(app) is True  # default: one renewal period plus 2 s (#29 item 4)
    assert _parking(app)._restart_grace_ms == 12_000  # type: ignore[attr-defined]
    for value, expected in ((False, False), (None, False), (2.5, 2.5)):
        app.conf.redislock_restart_grace = value
        assert restart_grace(app) == expected
    for value in ("30 s", 0, -1, float("nan"), [30], 0.001, 1.9):
        app.conf.redislock_restart_grace = value
        with pytest.raises(ConfigurationError, match=_naming("redislock_restart_grace", value)):
            restart_grace(app)


def test_a_kept_parking_semaphore_follows_every_setting_it_is_made_of() -> None:
    # parking_for keeps its semaphores (an LRU); each setting read into one must be a
    # part of what keeps it, or a change made at run time never reaches the pool.
    app = Celery("kept-parking", set_as_current=False)
    app.conf.update(redislock_url="redis://127.0.0.1:1/0")  # never connected to here
    first = parking_for(app, "pool", 2, 30.0, "redislock")
    assert parking_for(app, "pool", 2, 30.0, "redislock") is first
    app.conf.redislock_park_keep = 60.0
    assert parking_for(app, "pool", 2, 30.0, "redislock")._keep_ms == 60_000
    app.conf.broker_transport_options = {"visibility_timeout": 10800}
    assert parking_for(app, "pool", 2, 30.0, "redislock")._taken_ms == 21_600_000
    app.conf.redislock_restart_grace = False
    assert parking_for(app, "pool", 2, 30.0, "redislock")._restart_grace_ms == 0
