"""Eight processes take one Redlock on five masters: no two critical sections overlap
and fences increase in the order of the sections, also while a minority of the
masters is killed and restarted empty again and again."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from celery_redislock.testing import RedisServer

# Eight processes contending.
pytestmark = pytest.mark.serial

PROCESSES = 8
SECONDS = 6.0


Section = tuple[float, float, int]


def run_workers(masters: list[RedisServer], tmp_path: Path, chaos: bool) -> list[Section]:
    ports = ",".join(str(server.port) for server in masters)
    outs = [tmp_path / f"worker-{i}.log" for i in range(PROCESSES)]
    command = [sys.executable, "-m", "tests.topologies.redlock._workers", ports, "shared"]
    workers = [subprocess.Popen([*command, str(SECONDS), str(out)]) for out in outs]
    stop = threading.Event()
    restarts = [0]

    def havoc() -> None:
        # Two masters at a time (a minority) killed, started again empty 0.3 s later;
        # then a pause past their restart grace (1 s, the workers' TTL).
        pair = 0
        time.sleep(1.0)
        while not stop.is_set():
            victims = [masters[pair % 5], masters[(pair + 2) % 5]]
            for server in victims:
                server.kill()
            time.sleep(0.3)
            for server in victims:
                server.start()
                restarts[0] += 1
            pair += 1
            stop.wait(1.5)

    thread = threading.Thread(target=havoc, daemon=True)
    if chaos:
        thread.start()
    try:
        for worker in workers:
            assert worker.wait(SECONDS + 30) == 0
    finally:
        stop.set()
        for worker in workers:
            worker.kill()
            worker.wait()
        if chaos:
            thread.join(10)
    if chaos:
        assert restarts[0] >= 4
    sections = []
    for out in outs:
        for line in out.read_text().splitlines():
            start, end, fence, valid = line.split()
            if valid == "1":
                sections.append((float(start), float(end), int(fence)))
    return sorted(sections)


def check(sections: list[Section]) -> None:
    assert len(sections) > 100, len(sections)
    for (start, end, fence), (later_start, _, later_fence) in itertools.pairwise(sections):
        assert later_start >= end, f"overlap: {start}-{end} and {later_start}"
        assert later_fence > fence, f"fence {later_fence} after {fence}"


@pytest.mark.parametrize("chaos", [False, True], ids=["steady", "minority-restarted"])
def test_eight_processes_never_overlap_and_fences_increase(
    masters: list[RedisServer], tmp_path: Path, chaos: bool
) -> None:
    check(run_workers(masters, tmp_path, chaos))
