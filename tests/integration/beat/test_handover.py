"""A clean shutdown hands the leader lease over at once (well within the lease)."""

from __future__ import annotations

import time
from pathlib import Path

from celery import Celery

from ..workers import BROKER_DB, LOCKS_DB, db_url
from .inprocess import check, handover


def test_a_clean_shutdown_hands_over_at_once(redis_url: str, tmp_path: Path) -> None:
    app = Celery("handover", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(redis_url, LOCKS_DB),
        redislock_beat_group=f"handover-{time.monotonic_ns()}",
        redislock_beat_lease=5,
        task_default_queue=f"handover-{time.monotonic_ns()}",
    )
    check(handover(app, tmp_path), lease=5)
