"""``LeaderScheduler`` with its lease and slot claims on a Redis Cluster
(``redislock_cluster = True``): one leads, each slot once, a clean shutdown hands over."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from celery import Celery

from celery_redislock.testing_cluster import LocalCluster
from tests.integration.beat.inprocess import check, handover

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")


def test_beat_leads_and_claims_on_the_cluster(
    cluster: LocalCluster, redis_url: str, tmp_path: Path, ran: set[str]
) -> None:
    name = f"beat{uuid.uuid4().hex[:8]}"
    app = Celery(name, set_as_current=False)
    app.conf.update(
        broker_url=redis_url.rsplit("/", 1)[0] + "/1",
        redislock_url=cluster.url,
        redislock_cluster=True,
        redislock_beat_group=name,
        redislock_beat_lease=5,
        task_default_queue=f"q-{name}",
    )
    try:
        check(handover(app, tmp_path), lease=5)
        assert "beat_claim.lua" in ran  # the claims went to the cluster
    finally:
        app.close()
