"""A standby that takes over sends the next slot on time, however recently it started
(issue #26: "standbys take over within one lease"). Its inner scheduler never ticked
while it stood by, so its entries' last run was its start: an entry of interval ``i``
fired ``start + i``, up to an interval after the slot (an hourly entry up to an hour
late)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.signals import beat_slot_sent

from ..workers import BROKER_DB, LOCKS_DB, db_url

# Measures lateness against the clock and runs two schedulers: alone, after the parallel part.
pytestmark = pytest.mark.serial

INTERVAL = 6.0


def test_a_standby_started_just_before_the_takeover_sends_the_next_slot_on_time(
    redis_url: str, tmp_path: Path
) -> None:
    app = Celery("takeover", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(redis_url, LOCKS_DB),
        redislock_beat_group=f"takeover-{time.monotonic_ns()}",
        redislock_beat_lease=5,
        task_default_queue=f"takeover-{time.monotonic_ns()}",
        beat_schedule={"slow": {"task": "nothing", "schedule": INTERVAL}},
    )
    sent: list[tuple[float, float, Any]] = []  # (slot, sent at, sender)

    def on_sent(sender: Any, slot: Any, **_: Any) -> None:
        sent.append((slot.timestamp(), time.time(), sender))

    beat_slot_sent.connect(on_sent, weak=False)
    running: dict[Any, bool] = {}

    def run(scheduler: Any) -> None:
        while running[scheduler]:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))

    # Just after a slot T0: the leader starts; the standby starts 3.5 s later and the
    # leader shuts down 0.2 s after that, well before the next slot T0 + 6.
    time.sleep(INTERVAL - time.time() % INTERVAL + 0.1)
    t0 = time.time() // INTERVAL * INTERVAL
    leader = LeaderScheduler(app, schedule_filename=str(tmp_path / "a"))
    standby = None
    threads = []
    try:
        running[leader] = True
        threads.append(threading.Thread(target=run, args=(leader,)))
        threads[-1].start()
        time.sleep(max(0.0, t0 + 3.5 - time.time()))
        standby = LeaderScheduler(app, schedule_filename=str(tmp_path / "b"))
        running[standby] = True
        threads.append(threading.Thread(target=run, args=(standby,)))
        threads[-1].start()
        time.sleep(max(0.0, t0 + 3.7 - time.time()))
        assert leader.leads() and not standby.leads()
        running[leader] = False
        threads[0].join(10)
        leader.close()  # a clean shutdown: the standby takes over at once
        time.sleep(max(0.0, t0 + 2 * INTERVAL - 0.5 - time.time()))
    finally:
        running.update(dict.fromkeys(running, False))
        for thread in threads:
            thread.join(10)
        beat_slot_sent.disconnect(on_sent)
        leader.close()
        if standby is not None:
            standby.close()
    by_standby = [(slot, at) for slot, at, sender in sent if sender is standby]
    assert by_standby, sent
    slot, at = by_standby[0]
    assert slot == t0 + INTERVAL, sent
    assert at - slot < 1.5, f"the next slot was sent {at - slot:.2f} s late"


def test_a_leader_with_no_slot_on_record_does_not_resend_a_past_crontab_run(
    redis_url: str, tmp_path: Path
) -> None:
    # No claim in Redis (a Redis restarted empty, then a standby took over): the
    # standby's inner scheduler last ran its entries when it started, long ago, so its
    # crontab entry is overdue at once. Its latest run may have been sent by the old
    # leader (its claim is gone): at most once wins, the next run is the first sent.
    app = Celery("takeover-cron", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(redis_url, LOCKS_DB),
        redislock_beat_group=f"takeover-cron-{time.monotonic_ns()}",
        redislock_beat_lease=5,
        task_default_queue=f"takeover-cron-{time.monotonic_ns()}",
        beat_schedule={"cron": {"task": "nothing", "schedule": crontab()}},
    )
    sent: list[float] = []

    def on_sent(slot: Any, **_: Any) -> None:
        sent.append(slot.timestamp())

    beat_slot_sent.connect(on_sent, weak=False)
    scheduler = LeaderScheduler(app, schedule_filename=str(tmp_path / "s"))
    try:
        for entry in scheduler.schedule.values():
            entry.last_run_at = entry.last_run_at - timedelta(minutes=10)
        deadline = time.monotonic() + 30
        while not scheduler.leads() and time.monotonic() < deadline:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))
        elected = time.time()
        stop = time.monotonic() + 1.5
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))
    finally:
        beat_slot_sent.disconnect(on_sent)
        scheduler.close()
    assert all(slot > elected - 1 for slot in sent), f"sent a past run: {sent}, elected {elected}"
