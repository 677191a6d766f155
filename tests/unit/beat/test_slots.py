"""The slots of a schedule: every beat computes the same ones, from the schedule alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedstate, schedule

from celery_redislock.celery.beat.slots import (
    aligned,
    as_datetime,
    due_slots,
    fallback_slot,
    interval_ms,
    latest_slot,
)


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch() -> None:
    every_second = schedule(timedelta(seconds=1))
    assert due_slots(every_second, 10_500, 13_200) == [11_000, 12_000, 13_000]
    assert due_slots(every_second, 13_000, 13_999) == []  # slot 13 s is claimed already
    every_7 = schedule(timedelta(seconds=7))
    assert due_slots(every_7, 0, 30_000) == [7_000, 14_000, 21_000, 28_000]
    assert interval_ms(schedule(timedelta(milliseconds=1500))) == 1500


def test_two_beats_that_started_apart_compute_the_same_slots() -> None:
    every_5 = schedule(timedelta(seconds=5))
    # A beat that started at 2.3 s and one that started at 4.9 s, both asked at 17.1 s.
    assert due_slots(every_5, 2_300, 17_100) == [5_000, 10_000, 15_000]
    assert due_slots(every_5, 4_900, 17_100) == [5_000, 10_000, 15_000]


def test_crontab_slots_are_its_matching_minutes() -> None:
    quarter = crontab(minute="*/15", app=Celery(set_as_current=False, timezone="UTC"))
    after = ms("2026-11-28T10:07:30")
    now = ms("2026-11-28T10:46:10")
    assert [as_datetime(s).strftime("%H:%M") for s in due_slots(quarter, after, now) or []] == [
        "10:15",
        "10:30",
        "10:45",
    ]
    every_minute = crontab(app=Celery(set_as_current=False, timezone="UTC"))
    assert due_slots(every_minute, ms("2026-11-28T10:00:00"), ms("2026-11-28T10:02:59")) == [
        ms("2026-11-28T10:01:00"),
        ms("2026-11-28T10:02:00"),
    ]


def test_crontab_slots_follow_the_crontab_time_zone_and_day_of_week() -> None:
    app = Celery(set_as_current=False, timezone="Europe/Paris", enable_utc=True)
    # 09:00 Paris on Mondays (Celery's day_of_week: 0 is Sunday), UTC+1 in November.
    monday_nine = crontab(minute=0, hour=9, day_of_week=1, app=app)
    week = due_slots(monday_nine, ms("2026-11-28T00:00:00"), ms("2026-12-06T00:00:00"))
    assert week == [ms("2026-11-30T08:00:00")]  # Monday 30 November, 08:00 UTC


class OnceAt(BaseSchedule):
    """A custom schedule (neither interval nor crontab): one run at ``at``."""

    def __init__(self, at: datetime, now_ms: int) -> None:
        super().__init__(nowfun=lambda: as_datetime(now_ms))
        self.at = at

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return self.at - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(self.now() >= self.at and last_run_at < self.at, 60.0)


def test_other_schedules_are_not_aligned_and_use_their_due_time() -> None:
    now_ms = ms("2026-11-28T12:00:00")
    once = OnceAt(as_datetime(ms("2026-11-28T11:58:20")), now_ms)
    assert not aligned(once) and due_slots(once, 0, now_ms) is None
    assert aligned(schedule(timedelta(seconds=1))) and aligned(crontab(app=Celery()))
    last = as_datetime(now_ms) - timedelta(days=2)
    assert fallback_slot(once, last, now_ms) == ms("2026-11-28T11:58:20")
    assert fallback_slot(once, None, now_ms + 456) == now_ms
    # A due time in the future (asked early) is never a slot later than now.
    assert fallback_slot(OnceAt(as_datetime(now_ms + 5000), now_ms), last, now_ms) == now_ms


def test_the_latest_slot_of_a_span() -> None:
    every_second = schedule(timedelta(seconds=1))
    assert latest_slot(every_second, None, 13_200) == 13_000
    assert latest_slot(every_second, 12_000, 13_200) == 13_000
    assert latest_slot(every_second, 13_000, 13_999) is None  # claimed already
    daily = crontab(minute=30, hour=4, app=Celery(set_as_current=False, timezone="UTC"))
    now = ms("2026-03-02T04:29:59")
    assert latest_slot(daily, None, now) == ms("2026-03-01T04:30:00")
    assert latest_slot(daily, ms("2026-03-01T04:30:00"), now) is None
    assert latest_slot(daily, ms("2026-02-28T04:30:00"), now) == ms("2026-03-01T04:30:00")
    yearly = crontab(minute=0, hour=0, day_of_month=1, month_of_year=1)
    assert latest_slot(yearly, None, now) is None  # beyond the search: the caller decides
