"""``redislock_beat_catch_up`` on a real Redis, one ``LeaderScheduler`` ticking in the
test process (issue #26): 0 (Celery's own catch-up) still sends every slot as it
comes due, and a catch-up window shorter than an entry's interval (an hourly entry
with the default 300 s) neither drops slots nor reports slots as missed that were
all sent."""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.signals import beat_slot_sent

from ..workers import BROKER_DB, LOCKS_DB, db_url

# Counts slots sent by a ticking scheduler against the clock: alone, after the parallel part.
pytestmark = pytest.mark.serial


def _app(redis_url: str, schedule: float, **settings: Any) -> Celery:
    app = Celery("catch-up", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(redis_url, LOCKS_DB),
        redislock_beat_group=f"catch-up-{time.monotonic_ns()}",
        redislock_beat_lease=5,
        task_default_queue=f"catch-up-{time.monotonic_ns()}",
        beat_schedule={"every": {"task": "nothing", "schedule": schedule}},
        **settings,
    )
    return app


def _run(app: Celery, directory: Path, seconds: float) -> list[float]:
    """Tick one scheduler for ``seconds`` after it was elected: the slots it sent."""
    sent: collections.Counter[Any] = collections.Counter()
    guard = threading.Lock()

    def on_sent(slot: Any, **_: Any) -> None:
        with guard:
            sent[slot] += 1

    beat_slot_sent.connect(on_sent, weak=False)
    scheduler = LeaderScheduler(app, schedule_filename=str(directory / "s"))
    try:
        deadline = time.monotonic() + 30
        while not scheduler.leads() and time.monotonic() < deadline:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))
    finally:
        beat_slot_sent.disconnect(on_sent)
        scheduler.close()
    assert set(sent.values()) <= {1}, sent
    return sorted(s.timestamp() for s in sent)


def test_catch_up_zero_still_sends_every_slot(redis_url: str, tmp_path: Path) -> None:
    # 0 means "no making up of missed slots", not "nothing after the first one".
    app = _app(redis_url, 0.2, redislock_beat_catch_up=0)
    sent = _run(app, tmp_path, 2.0)
    assert len(sent) >= 5, sent


def test_a_window_shorter_than_the_interval_reports_nothing_missed(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every slot of a 1 s entry is sent on time; the 0.3 s window is shorter than the
    # interval, as 300 s is for an hourly entry: no slot was missed, none is reported.
    app = _app(redis_url, 1.0, redislock_beat_catch_up=0.3)
    with caplog.at_level(logging.WARNING, logger="celery_redislock.beat"):
        sent = _run(app, tmp_path, 3.5)
    assert len(sent) >= 3, sent
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert set(gaps) == {1.0}, sent
    missed = [r.getMessage() for r in caplog.records if "not sent and are older" in r.getMessage()]
    assert not missed, missed
