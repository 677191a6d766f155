"""A claim whose every reply was lost (the claim ran on Redis, redis-py's tries ran out)
is claimed again, by the same beat, at the entry's next send: the slot was recorded
as this beat's, so no catch-up would ever send it, although the beat logged that it
was not sent (issue #26: no slot silently skipped). Real Redis through the fault
proxy, one ``LeaderScheduler`` ticking in the test process."""

from __future__ import annotations

import collections
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.claims import CLAIM
from celery_redislock.celery.beat.signals import beat_slot_sent
from tests.faults import FaultProxy

from ..workers import BROKER_DB, LOCKS_DB, db_url

# Counts slots a ticking scheduler sends against the clock: alone, after the parallel part.
pytestmark = pytest.mark.serial

TRIES = 2


def test_a_slot_whose_claim_reply_was_lost_is_sent_later_once(
    redis_url: str, fault_proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("lost-claim", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(fault_proxy.url, LOCKS_DB),
        # No re-send by redis-py: the one lost reply is the claim call's error.
        redislock_client_options={"retry": Retry(NoBackoff(), 0)},
        redislock_beat_group=f"lost-claim-{time.monotonic_ns()}",
        redislock_beat_lease=5,
        task_default_queue=f"lost-claim-{time.monotonic_ns()}",
        beat_schedule={"every": {"task": "nothing", "schedule": 0.5}},
    )
    sent: collections.Counter[float] = collections.Counter()

    def on_sent(slot: Any, **_: Any) -> None:
        sent[slot.timestamp()] += 1

    beat_slot_sent.connect(on_sent, weak=False)
    scheduler = LeaderScheduler(app, schedule_filename=str(tmp_path / "s"))

    def tick_for(seconds: float) -> None:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))

    try:
        deadline = time.monotonic() + 30
        while not sent and time.monotonic() < deadline:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))
        # Every try of one claim call loses its reply (redis-py's and a re-send of a
        # request on a connection found closed).
        fault_proxy.drop_reply(match=CLAIM.sha.encode(), times=TRIES)
        with caplog.at_level(logging.WARNING, logger="celery_redislock.beat"):
            tick_for(1.5)
            assert fault_proxy.wait_dropped(TRIES, timeout=5)
        assert any("cannot claim its slot" in r.getMessage() for r in caplog.records)
        tick_for(1.5)
    finally:
        beat_slot_sent.disconnect(on_sent)
        scheduler.close()
    slots = sorted(sent)
    assert set(sent.values()) == {1}, sent
    expected = [slots[0] + 0.5 * i for i in range(len(slots))]
    assert slots == expected, f"a slot was never sent: {slots}"
