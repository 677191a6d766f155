"""``LeaderScheduler`` with its lease and slot claims through Sentinel (``redislock_url``
in Sentinel form): one leads, each slot once, a clean shutdown hands over."""

from __future__ import annotations

import uuid
from pathlib import Path

from celery import Celery

from celery_redislock.testing_sentinel import SentinelGroup
from tests.integration.beat.inprocess import check, handover


def test_beat_leads_and_claims_through_sentinel(
    group: SentinelGroup, redis_url: str, tmp_path: Path
) -> None:
    name = f"beat{uuid.uuid4().hex[:8]}"
    app = Celery(name, set_as_current=False)
    app.conf.update(
        broker_url=redis_url.rsplit("/", 1)[0] + "/1",
        redislock_url=group.url,
        redislock_transport_options={"master_name": group.master_name},
        redislock_beat_group=name,
        redislock_beat_lease=5,
        task_default_queue=f"q-{name}",
    )
    try:
        check(handover(app, tmp_path), lease=5)
    finally:
        app.close()
