"""The slots of a schedule entry: the scheduled times its runs belong to.

A slot is what two beats must agree on without talking to each other, so it is
computed from the schedule alone, never from when a beat happened to tick:

* an interval entry (``celery.schedules.schedule``, e.g. ``timedelta(seconds=10)``)
  fires at the multiples of its interval since the Unix epoch (UTC), so every beat
  computes the same slots whenever it started;
* a ``crontab`` entry fires at each minute its fields match, in the crontab's time
  zone (Celery's rule: minute, hour, day of week, day of month and month all match);
* any other schedule (``solar``, django-celery-beat's ``clocked``, a custom one) has
  one slot per run: the time the run came due, from the entry's ``last_run_at``
  (``last_run_at`` plus the schedule's ``remaining_estimate``), to the second. Beats
  agree on it when they share ``last_run_at`` (a database or RedBeat scheduler);
  with a private schedule file each beat has its own and duplicates are not excluded.

All times are epoch milliseconds (int), the form the claims store.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Final

from celery.schedules import crontab, schedule

__all__ = [
    "LATEST_SEARCH_MS",
    "MINUTE_MS",
    "aligned",
    "as_datetime",
    "due_slots",
    "fallback_slot",
    "interval_ms",
    "latest_slot",
]

MINUTE_MS: Final = 60_000

LATEST_SEARCH_MS: Final = 8 * 24 * 3_600_000
"""How far back :func:`latest_slot` walks a crontab's minutes (a weekly entry's span and
a day more): ~11,500 minute checks at most."""


def as_datetime(slot_ms: int) -> datetime:
    """The slot as an aware UTC datetime."""
    return datetime.fromtimestamp(slot_ms / 1000.0, tz=timezone.utc)


def interval_ms(entry_schedule: object) -> int | None:
    """The interval of a plain interval schedule in ms, else None (crontab, solar, ...)."""
    if not isinstance(entry_schedule, schedule):
        return None
    run_every = getattr(entry_schedule, "run_every", None)
    if not isinstance(run_every, timedelta) or run_every.total_seconds() <= 0:
        return None
    return max(1, round(run_every.total_seconds() * 1000))


def aligned(entry_schedule: object) -> bool:
    """True when the schedule's slots come from the schedule alone (interval, crontab)."""
    return interval_ms(entry_schedule) is not None or isinstance(entry_schedule, crontab)


def _crontab_matches(cron: Any, minute: datetime) -> bool:
    local = minute.astimezone(cron.tz)
    return (
        local.minute in cron.minute
        and local.hour in cron.hour
        and local.isoweekday() % 7 in cron.day_of_week
        and local.day in cron.day_of_month
        and local.month in cron.month_of_year
    )


def due_slots(entry_schedule: object, after_ms: int, now_ms: int) -> list[int] | None:
    """The slots in ``(after_ms, now_ms]``, oldest first; None for a schedule whose
    slots are not aligned (see :func:`fallback_slot`).

    The caller bounds the window (``redislock_beat_catch_up``): a crontab window is
    walked minute by minute.
    """
    interval = interval_ms(entry_schedule)
    if interval is not None:
        first = after_ms // interval + 1
        last = now_ms // interval
        return [k * interval for k in range(first, last + 1)]
    if isinstance(entry_schedule, crontab):
        start = after_ms // MINUTE_MS + 1
        end = now_ms // MINUTE_MS
        return [
            m * MINUTE_MS
            for m in range(start, end + 1)
            if _crontab_matches(entry_schedule, as_datetime(m * MINUTE_MS))
        ]
    return None


def latest_slot(entry_schedule: object, after_ms: int | None, before_ms: int) -> int | None:
    """The latest slot in ``(after_ms, before_ms]`` (no lower bound when ``after_ms`` is
    None); None when there is none, the schedule is not aligned, or a crontab has none
    in the :data:`LATEST_SEARCH_MS` before ``before_ms``."""
    interval = interval_ms(entry_schedule)
    if interval is not None:
        slot = before_ms // interval * interval
        return slot if after_ms is None or slot > after_ms else None
    if isinstance(entry_schedule, crontab):
        floor = (before_ms - LATEST_SEARCH_MS) // MINUTE_MS
        if after_ms is not None:
            floor = max(floor, after_ms // MINUTE_MS)
        for m in range(before_ms // MINUTE_MS, floor, -1):
            if _crontab_matches(entry_schedule, as_datetime(m * MINUTE_MS)):
                return m * MINUTE_MS
    return None


def fallback_slot(entry_schedule: Any, last_run_at: datetime | None, now_ms: int) -> int:
    """The slot of a run of a schedule that is not aligned: when it came due after
    ``last_run_at`` (to the second, never later than now)."""
    now_s = now_ms // 1000 * 1000
    if last_run_at is None:
        return now_s
    try:
        # Time from now until the run after last_run_at (negative: overdue since).
        remaining = entry_schedule.remaining_estimate(last_run_at)
    except (AttributeError, TypeError, ValueError):
        return now_s
    if not isinstance(remaining, timedelta):
        return now_s
    # Rounded: the estimate counts from the schedule's own now, microseconds apart.
    due_ms = round(now_ms / 1000.0 + remaining.total_seconds()) * 1000
    if isinstance(entry_schedule, crontab):
        due_ms = round(due_ms / MINUTE_MS) * MINUTE_MS
    return min(due_ms, now_s)
