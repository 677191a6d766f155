"""Slot claims on a real Redis: atomic, forward-only, safe to re-send; and two
``LeaderScheduler``\\ s that both believe they lead still send each slot once."""

from __future__ import annotations

import collections
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.claims import CLAIM, BeatKeys, Claims
from celery_redislock.celery.beat.leader import Leadership
from celery_redislock.celery.beat.signals import beat_slot_sent, beat_slot_skipped
from tests.faults import FaultProxy

from ..workers import BROKER_DB, LOCKS_DB, db_url


@pytest.fixture
def keys(r: redis.Redis) -> BeatKeys:
    return BeatKeys.of("redislock", f"claims-{time.monotonic_ns()}")


def test_claims_only_move_forward(r: redis.Redis, keys: BeatKeys) -> None:
    a = Claims(r, keys, "a")
    b = Claims(r, keys, "b")
    assert a.last("e") is None
    assert a.claim("e", 2000) == (True, 2000)
    assert b.claim("e", 2000) == (False, 2000)  # the same slot: taken
    assert b.claim("e", 1000) == (False, 2000)  # an older slot: never sent late
    assert b.claim("e", 3000) == (True, 3000)
    assert b.claim("other", 1000) == (True, 1000)  # entries are apart
    assert a.last("e") == 3000


def test_a_claim_re_sent_after_its_reply_was_lost_is_still_ours(
    fault_proxy: FaultProxy, r: redis.Redis, keys: BeatKeys
) -> None:
    client = fault_proxy.client()
    claims = Claims(client, keys, "a")
    fault_proxy.drop_reply(match=CLAIM.sha.encode())
    assert claims.claim("e", 5000) == (True, 5000)  # redis-py re-sent it: same answer
    assert fault_proxy.wait_dropped(1, timeout=5)
    assert Claims(r, keys, "b").claim("e", 5000) == (False, 5000)
    client.close()


def _claim_all(url: str, sent: str, by: str, owner: str, slots: int, out: Any, start: Any) -> None:
    client = redis.Redis.from_url(url)
    claims = Claims(client, BeatKeys(sent, by), owner)
    client.ping()
    start.wait()
    granted = []
    for slot in range(1, slots + 1):
        if claims.claim("e", slot * 1000)[0]:
            granted.append(slot)
        time.sleep(0.002)  # spread over a second or more: the processes overlap
    out.put(granted)


def test_racing_processes_each_slot_granted_exactly_once(redis_url: str, keys: BeatKeys) -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = context.Barrier(4)
    workers = [
        context.Process(
            target=_claim_all,
            args=(redis_url, keys.sent, keys.by, f"p{i}", 500, out, start),
        )
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    granted = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(30)
    counts = collections.Counter(s for mine in granted for s in mine)
    assert sorted(counts) == list(range(1, 501))
    assert set(counts.values()) == {1}
    assert sum(1 for mine in granted if mine) >= 2, "no race happened"


@pytest.fixture
def beat_app(redis_url: str) -> Iterator[Celery]:
    app = Celery("claims-race", set_as_current=False)
    app.conf.update(
        broker_url=db_url(redis_url, BROKER_DB),
        redislock_url=db_url(redis_url, LOCKS_DB),
        redislock_beat_group=f"race-{time.monotonic_ns()}",
        redislock_beat_lease=2,
        task_default_queue=f"claims-race-{time.monotonic_ns()}",
        beat_schedule={"fast": {"task": "nothing", "schedule": 0.2}},
    )
    yield app


@pytest.mark.serial  # two schedulers must meet on a slot in time: not under parallel load
def test_two_beats_that_both_believe_they_lead_send_each_slot_once(
    beat_app: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim is the last line of defence: here both beats pass their lease check
    # (as a paused leader may, just before it is paused) and tick side by side.
    monkeypatch.setattr(Leadership, "leads", lambda self: True)
    sent: collections.Counter[tuple[str, Any]] = collections.Counter()
    skipped: list[Any] = []
    guard = threading.Lock()

    def on_sent(entry: str, slot: Any, **_: Any) -> None:
        with guard:
            sent[(entry, slot)] += 1

    def on_skipped(slot: Any, **_: Any) -> None:
        skipped.append(slot)

    beat_slot_sent.connect(on_sent, weak=False)
    beat_slot_skipped.connect(on_skipped, weak=False)
    schedulers = [
        LeaderScheduler(beat_app, schedule_filename=str(tmp_path / f"s{i}")) for i in range(2)
    ]
    stop = time.monotonic() + 3

    def run(scheduler: Any) -> None:
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))

    try:
        threads = [threading.Thread(target=run, args=(s,)) for s in schedulers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        beat_slot_sent.disconnect(on_sent)
        beat_slot_skipped.disconnect(on_skipped)
        for scheduler in schedulers:
            scheduler.close()
    assert len(sent) >= 5, sent
    assert set(sent.values()) == {1}, sent
    assert skipped, "the two beats never met on a slot"
