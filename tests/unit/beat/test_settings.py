"""``redislock_beat_*`` settings are checked: a bad one raises ConfigurationError naming it."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.beat import PersistentScheduler, Scheduler

from celery_redislock import ConfigurationError
from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.settings import BeatSettings


def app_with(**conf: Any) -> Celery:
    app = Celery("beat-settings", set_as_current=False)
    app.conf.update(conf)
    return app


def test_defaults() -> None:
    settings = BeatSettings.from_app(app_with())
    assert settings.scheduler is PersistentScheduler
    assert (settings.lease, settings.group, settings.catch_up) == (10.0, "default", 300.0)
    assert settings.prefix == "redislock"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("redislock_beat_lease", 0),
        ("redislock_beat_lease", "10"),
        ("redislock_beat_lease", float("nan")),
        ("redislock_beat_group", ""),
        ("redislock_beat_group", 3),
        ("redislock_beat_catch_up", -1),
        ("redislock_beat_catch_up", True),
        ("redislock_beat_scheduler", "no.such.module:Scheduler"),
        ("redislock_beat_scheduler", "celery.beat:Service"),
        ("redislock_beat_scheduler", 42),
        ("redislock_prefix", "a{b}"),
    ],
)
def test_a_bad_setting_is_named(setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=setting):
        BeatSettings.from_app(app_with(**{setting: value}))


def test_catch_up_zero_and_a_class_are_accepted() -> None:
    settings = BeatSettings.from_app(
        app_with(redislock_beat_catch_up=0, redislock_beat_scheduler=Scheduler)
    )
    assert settings.catch_up == 0.0 and settings.scheduler is Scheduler


def test_leader_scheduler_cannot_guard_itself() -> None:
    app = app_with(redislock_beat_scheduler="celery_redislock.beat:LeaderScheduler")
    with pytest.raises(ConfigurationError, match="redislock_beat_scheduler"):
        LeaderScheduler(app, lazy=True)


def test_it_is_the_inner_scheduler_with_the_guard_in_front(tmp_path: Any) -> None:
    app = app_with(redislock_url="redis://127.0.0.1:1/0")
    scheduler = LeaderScheduler(app, lazy=True, schedule_filename=str(tmp_path / "s"))
    assert isinstance(scheduler, LeaderScheduler) and isinstance(scheduler, PersistentScheduler)
    assert "leader lease" in scheduler.info
    scheduler.close()
