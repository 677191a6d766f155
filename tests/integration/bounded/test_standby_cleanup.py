"""Standbys (``concurrency_standby``) and the worker's main process: a permit it gives
back for a dead run goes to the standby waiting in place, and the next parked run is
published ahead as the new standby, as a run's own release does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from celery_redislock.core.parking import ParkingSemaphore

from ..helpers import wait_until
from ..workers import AppModule, WorkerProcess

pytestmark = pytest.mark.slow

BODY = """
from celery_redislock import bounded_task


@bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_standby=1,
              lock_ttl=30)
def hold(n):
    locks.rpush("started", f"{n} {os.getpid()}")
    locks.blpop(f"go:{n}", 30)
    return n
"""


def test_a_permit_the_main_process_gives_back_tops_the_standbys_up(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # lock_ttl=30: the permit comes back by the clean-up, not by expiry. Before, the
    # clean-up released through a semaphore without standbys: the standby got the permit
    # but the next parked run stayed parked until a run's own release.
    lot = ParkingSemaphore(locks, "api", limit=1)

    def waiting_and_parked() -> tuple[int, int]:
        return locks.zcard(lot.keys.queue), lot.parking_info().parked

    module = AppModule(tmp_path, redis_url, BODY)
    with WorkerProcess(module, concurrency=3) as worker:
        tasks = module.load()
        killed = tasks.hold.delay(0)
        started = wait_until(lambda: locks.lindex("started", 0), what="the first run")
        others = [tasks.hold.delay(n) for n in (1, 2)]
        wait_until(lambda: waiting_and_parked() == (1, 1), what="1 waiting in place, 2 parked")
        os.kill(int(started.split()[1]), signal.SIGKILL)
        worker.wait_for_log("released the permit of pool 'api' held by", timeout=20)
        assert wait_until(lambda: locks.lindex("started", 1), what="the standby's run")[:1] == b"1"
        wait_until(lambda: waiting_and_parked() == (1, 0), timeout=5, what="2 the new standby")
        locks.rpush("go:1", 1)
        locks.rpush("go:2", 1)
        assert [r.get(timeout=15) for r in others] == [1, 2]
        with pytest.raises(Exception, match=r"Worker exited prematurely|SIGKILL"):
            killed.get(timeout=15)
