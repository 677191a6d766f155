"""What a SIGKILL costs the counters (#27): a process's recorder sends what it
counted within SPACING (20 ms) plus one send, so a process killed mid-stream loses at
most the events it recorded in that window before the kill -- never older ones."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import redis

from celery_redislock.celery.metrics.recorder import SPACING

from . import _kill_child

pytestmark = pytest.mark.serial  # times a window of milliseconds

spawn = multiprocessing.get_context("spawn")

SLACK = 0.1
"""Seconds allowed beyond SPACING: one send's round trip and the time a loaded
machine keeps the recorder's thread from running (24 kills at load ~5 on 2 cores:
the oldest event lost at most 20.7 ms old; docs/operations/metrics.md)."""


def _kill_mid_stream(url: str, r: redis.Redis, name: str) -> tuple[int, int, float]:
    """(events recorded, events counted in Redis, age at the kill of the oldest event
    lost; 0.0 when none was)."""
    stamps = spawn.Array("d", 20_000, lock=False)
    progress = spawn.Value("i", 0, lock=False)
    child = spawn.Process(
        target=_kill_child.record_steadily, args=(url, name, stamps, progress, 0.0005)
    )
    child.start()
    try:
        deadline = time.monotonic() + 60
        while progress.value < 300:  # counting steadily, its recorder's thread going
            assert child.is_alive() and time.monotonic() < deadline, "the child never counted"
            time.sleep(0.01)
        time.sleep(0.2)
        assert child.pid is not None
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(10)
    recorded = progress.value
    counted = int(r.hget(f"redislock:metrics:lock:{{{name}}}", "n:granted") or 0)
    assert 0 < counted <= recorded + 1  # +1: the one recorded as the kill came
    # Counted in the order recorded: the first one lost is event number `counted`.
    oldest_lost = killed_at - stamps[counted] if counted < recorded else 0.0
    return recorded, counted, oldest_lost


def test_a_sigkill_loses_only_the_last_window(redis_url: str, r: redis.Redis) -> None:
    ages = []
    for attempt in range(3):
        recorded, counted, age = _kill_mid_stream(redis_url, r, f"killed-{attempt}")
        assert age <= SPACING + SLACK, (recorded, counted, age)
        ages.append(age)
    # The window is real: a kill while counting steadily usually finds events pending
    # (a kill landing right after a send finds none, hence not asserted per attempt).
    print(f"oldest event lost per kill: {[f'{a * 1000:.1f} ms' for a in ages]}")
