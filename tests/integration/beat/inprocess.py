"""Two ``LeaderScheduler``\\ s in the test process, ticking side by side on threads:
one leads; when it shuts down cleanly the other takes over at once. Used on one
Redis (``test_handover.py``) and on Sentinel and Cluster (``tests/topologies``)."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from celery_redislock.beat import LeaderScheduler
from celery_redislock.celery.beat.signals import beat_elected, beat_slot_sent

__all__ = ["Handover", "handover"]


@dataclass
class Handover:
    """What two schedulers did: slots sent (how often each), when each was elected."""

    sent: collections.Counter[Any] = field(default_factory=collections.Counter)
    elected: list[tuple[float, int]] = field(default_factory=list)
    closed_at: float = 0.0


def handover(app: Celery, directory: Path, seconds: float = 2.0) -> Handover:
    """Run two schedulers of ``app`` (an entry every 0.2 s) for ``seconds``, close the
    leader, run the other ``seconds`` more."""
    app.conf.beat_schedule = {"fast": {"task": "nothing", "schedule": 0.2}}
    schedulers = [
        LeaderScheduler(app, schedule_filename=str(directory / f"s{i}")) for i in range(2)
    ]
    result = Handover()
    guard = threading.Lock()

    def on_sent(sender: Any, slot: Any, **_: Any) -> None:
        with guard:
            result.sent[slot] += 1

    def on_elected(sender: Any, **_: Any) -> None:
        if sender in schedulers:
            result.elected.append((time.monotonic(), schedulers.index(sender)))

    beat_slot_sent.connect(on_sent, weak=False)
    beat_elected.connect(on_elected, weak=False)
    running = [True, True]

    def run(index: int) -> None:
        scheduler = schedulers[index]
        while running[index]:
            time.sleep(max(0.0, min(scheduler.tick(), 0.05)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not result.elected and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(seconds)
        leader = result.elected[0][1]
        running[leader] = False
        threads[leader].join(10)
        schedulers[leader].close()  # a clean shutdown: the lease is released
        result.closed_at = time.monotonic()
        time.sleep(seconds)
    finally:
        running[:] = [False, False]
        for thread in threads:
            thread.join(10)
        beat_slot_sent.disconnect(on_sent)
        beat_elected.disconnect(on_elected)
        for scheduler in schedulers:
            scheduler.close()
    return result


def check(result: Handover, lease: float) -> None:
    """One leader at a time, each slot once, the standby elected soon after the close."""
    assert len(result.elected) == 2, result.elected
    assert result.elected[0][1] != result.elected[1][1]
    assert set(result.sent.values()) == {1}, result.sent
    took = result.elected[1][0] - result.closed_at
    assert took < lease / 2, f"the standby took {took:.2f} s over a released lease"
