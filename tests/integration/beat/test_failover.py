"""Three ``celery beat`` processes with ``LeaderScheduler``: one sends, each slot once.

The short CI version of issue #26's scenario (the 3-minute one with a crontab entry,
and the failover times, are in ``benchmarks/bench_beat.py``): an interval entry every
second and a 2 s lease; the first leader is cut from the lock Redis (its connection
stalled at a fault proxy), the next one SIGKILLed, the next SIGSTOPped for longer than
the lease and resumed (so for a moment two beats believe they lead). Counted at a
real worker by (entry, slot): every slot from the first to the last sent exactly
once, no gap between runs longer than a lease plus an interval (plus slack for a
loaded machine), and the paused beat sends nothing after it wakes up.
"""

from __future__ import annotations

import collections
import itertools
import signal
import time
from pathlib import Path

import pytest

from tests.faults import FaultProxy

from ..workers import LOCKS_DB, WorkerProcess
from .beats import BeatProcess, Run, beat_module, runs, wait_for

# Real beats measured against lease and interval bounds: alone, after the parallel part.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

LEASE = 2.0
INTERVAL = 1.0
SLACK = 2.0  # seconds of scheduling delay a loaded 2-core machine may add to a handover
# A short socket timeout: the cut beat's calls give up soon (redis-py's default is 5 s).
CONF = f'{{"redislock_beat_lease": {LEASE}, "redislock_client_options": {{"socket_timeout": 1.0}}}}'
SCHEDULE = '{"every-second": {"task": "beat_tick", "schedule": 1.0, "args": ("every-second",)}}'


def leader(beats: list[BeatProcess], exclude: tuple[BeatProcess, ...] = ()) -> BeatProcess:
    """The beat that logged its election last (among those not excluded)."""
    best: tuple[int, BeatProcess] | None = None
    for beat in beats:
        if beat in exclude:
            continue
        count = beat.log().count("beat: leading group")
        lost = beat.log().count("lost the leader lease")
        if count > lost and (best is None or count > best[0]):
            best = (count, beat)
    assert best is not None, "no beat leads"
    return best[1]


def wait_new_leader(beats: list[BeatProcess], old: BeatProcess, timeout: float) -> BeatProcess:
    found: list[BeatProcess] = []

    def elected() -> bool:
        for beat in beats:
            if beat is not old and beat.log().count("beat: leading group") > beat.log().count(
                "lost the leader lease"
            ):
                found.append(beat)
                return True
        return False

    wait_for(elected, timeout, "a new leader")
    return found[0]


def check_exactly_once(recorded: list[Run], entry: str) -> list[float]:
    """Every slot of ``entry`` from the first to the last run exactly once; the slots."""
    counts = collections.Counter(run.slot for run in recorded if run.entry == entry)
    duplicates = {slot: n for slot, n in counts.items() if n > 1}
    assert not duplicates, f"slots sent more than once: {duplicates}"
    slots = sorted(s for s in counts if s is not None)
    expected = [
        slots[0] + k * INTERVAL for k in range(round((slots[-1] - slots[0]) / INTERVAL) + 1)
    ]
    missing = sorted(set(expected) - set(slots))
    assert not missing, f"slots never sent: {missing}"
    return slots


def max_gap(recorded: list[Run]) -> float:
    times = sorted(run.ran_at for run in recorded)
    return max(b - a for a, b in itertools.pairwise(times))


def test_three_beats_each_slot_once_through_cut_kill_and_pause(
    tmp_path: Path, redis_url: str, fault_proxy: FaultProxy
) -> None:
    module = beat_module(
        tmp_path,
        redis_url,
        schedule=SCHEDULE,
        conf=CONF,
    )
    cut_url = fault_proxy.url.rsplit("/", 1)[0] + f"/{LOCKS_DB}"
    with WorkerProcess(module, pool="solo", concurrency=1):
        first = BeatProcess(module, lock_url=cut_url).start()  # reaches Redis through the proxy
        beats = [first]
        try:
            wait_for(lambda: "beat: leading group" in first.log(), 30, "the first leader")
            beats += [BeatProcess(module).start(), BeatProcess(module).start()]
            time.sleep(4)

            fault_proxy.pause()  # the leader is cut from the lock Redis
            second = wait_new_leader(beats, first, 30)
            wait_for(lambda: "lost the leader lease" in first.log(), 10, "the cut beat's loss")
            time.sleep(2)
            fault_proxy.resume()
            time.sleep(2)

            second.kill()  # SIGKILL
            third = wait_new_leader([b for b in beats if b is not second], second, 30)
            time.sleep(3)

            losses = third.log().count("lost the leader lease")
            third.signal(signal.SIGSTOP)  # paused for longer than its lease
            fourth = wait_new_leader([b for b in beats if b not in (second, third)], third, 30)
            time.sleep(2)
            third.signal(signal.SIGCONT)
            resumed_at = time.time()
            time.sleep(4)
            stopping_at = time.time()  # from here a beat stopped hands over: rightly
        finally:
            for beat in beats:
                beat.stop()
        time.sleep(2)  # the worker runs what is queued
        recorded = runs(module, redis_url)

    logs = "\n\n".join(f"--- beat {b.pid}\n{b.log()[-4000:]}" for b in beats)
    assert fourth is not third
    check_exactly_once(recorded, "every-second")
    gap = max_gap(recorded)
    assert gap <= LEASE + INTERVAL + SLACK, f"a gap of {gap:.2f} s between runs\n{logs}"
    # The paused beat woke up as a standby: nothing it sent ran after it woke.
    third_owner = next(
        line.split(" as ")[1].split(" ")[0]
        for line in third.log().splitlines()
        if "beat: leading group" in line
    )
    late = [r for r in recorded if r.sender == third_owner and resumed_at < r.ran_at < stopping_at]
    assert not late, f"the resumed beat sent {late}\n{logs}"
    assert third.log().count("lost the leader lease") == losses + 1, logs  # one line
