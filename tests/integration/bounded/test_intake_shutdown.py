"""A run handed a permit at intake that its worker drops before it starts (warm
shutdown; a rate-limit bucket cleared on a lost broker connection): the permit must
not stay reserved for ``lock_ttl``.

Celery's warm shutdown lets the pool finish its running tasks but sends nothing new
to it (a job not yet written to a pool process is dropped: the broker redelivers its
unacknowledged message). Intake's hand-over acknowledged such a message and reserved
a permit for it: the run was gone from the broker, the permit sat reserved for
``lock_ttl`` until the sweeper published the entry again -- the pool idled (the flake
of ``test_processes.py::test_a_limit_changed_in_configuration_spares_running_tasks``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import redis
from celery.result import AsyncResult

from ...faults import FaultProxy
from ..workers import AppModule, WorkerProcess
from .helpers import RECORD, holders, runs

pytestmark = [pytest.mark.slow]

LOCK_TTL = 30.0


def _module(tmp_path: Path, url: str, limit: int, rate_limit: str | None = None) -> AppModule:
    """An app of one task ``call(n, seconds)`` of pool "api" (``limit``; Celery's
    ``rate_limit`` beside it when given), its workers prefetching one message."""
    rate = "" if rate_limit is None else f", rate_limit={rate_limit!r}"
    return AppModule(
        tmp_path,
        url,
        RECORD
        + f"""
from celery_redislock import bounded_task

@bounded_task(app=app, concurrency_limit={limit}, concurrency_key="api", lock_ttl={LOCK_TTL}{rate})
def call(n, seconds):
    record("runs", str(n), seconds)
    return n
""",
        conf='{"worker_prefetch_multiplier": 1}',
    )


def _seconds_to_run_on_b(module: AppModule, result: AsyncResult[int]) -> float:
    """How long a fresh worker b, started once a is gone, takes to run ``result``'s
    ``call(1, ...)``."""
    with WorkerProcess(module, concurrency=2, name="b"):
        started = time.monotonic()
        assert result.get(timeout=LOCK_TTL + 15) == 1
        return time.monotonic() - started


def _ran_once_each_and_nothing_held(locks: redis.Redis) -> None:
    assert [label for _, _, label in runs(locks, "runs")] == ["0", "1"]  # once each
    assert not holders(locks, "api")


def test_a_message_taken_in_warm_shutdown_runs_elsewhere_at_once(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # Worker a runs one long task of a limit-2 pool (a permit is free), is shut down
    # warmly, and a message of the pool is sent while it finishes that task: a's
    # pending fetch takes it. It must not run on a, nor wait for lock_ttl: worker b,
    # started once a is gone, runs it at once.
    module = _module(tmp_path, redis_url, limit=2)
    a = WorkerProcess(module, concurrency=2, name="a").start()
    try:
        tasks = module.load()
        long = tasks.call.delay(0, 4.0)
        wait_long = time.monotonic() + 20
        while len(holders(locks, "api")) != 1 and time.monotonic() < wait_long:
            time.sleep(0.05)
        assert a.process is not None
        a.process.send_signal(signal.SIGTERM)  # warm shutdown: the long task finishes
        a.wait_for_log("Warm shutdown")
        short = tasks.call.delay(1, 0.1)
        a.wait_for_log(short.id)  # a took it (its fetch was pending)
        a.process.wait(30)
    finally:
        a.stop()
    assert long.get(timeout=5) == 0
    took = _seconds_to_run_on_b(module, short)
    _ran_once_each_and_nothing_held(locks)
    assert took < LOCK_TTL / 3, f"the run waited {took:.1f}s: its permit was reserved on a"


def test_a_run_handed_a_permit_and_waiting_for_a_rate_limit_token_at_shutdown(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    # Celery's rate_limit beside the pool (#29 item 1): a message handed a permit at
    # intake waits in the task's token bucket of worker a when a is shut down warmly.
    # It never runs on a; its permit must not stay reserved for lock_ttl: worker b,
    # started once a is gone, runs it at once.
    module = _module(tmp_path, redis_url, limit=3, rate_limit="6/m")
    a = WorkerProcess(module, concurrency=2, name="a").start()
    try:
        tasks = module.load()
        assert tasks.call.delay(0, 0.1).get(timeout=20) == 0  # the bucket's one token
        waiting = tasks.call.delay(1, 0.1)  # handed a permit; its token 10 s away
        a.wait_for_log(waiting.id)
        time.sleep(0.5)
        assert len(holders(locks, "api")) == 1  # its reserved permit
        assert a.process is not None
        a.process.send_signal(signal.SIGTERM)
        a.process.wait(30)
    finally:
        a.stop()
    took = _seconds_to_run_on_b(module, waiting)
    _ran_once_each_and_nothing_held(locks)
    assert took < LOCK_TTL / 3, f"the run waited {took:.1f}s: its permit was reserved on a"


def test_a_run_handed_a_permit_and_waiting_for_a_token_when_the_broker_connection_drops(
    tmp_path: Path, redis_url: str, locks: redis.Redis, fault_proxy: FaultProxy
) -> None:
    # Celery's consumer clears the rate-limit buckets when its broker connection
    # closes (their messages, unacknowledged, come back from the broker). A message
    # handed a permit at intake was acknowledged: given back, it runs once the worker
    # is connected again and its token is due -- not after lock_ttl.
    # broker and lock Redis through the proxy
    module = _module(tmp_path, fault_proxy.url, limit=3, rate_limit="10/m")
    with WorkerProcess(module, concurrency=2, name="a") as a:
        tasks = module.load()
        assert tasks.call.delay(0, 0.1).get(timeout=20) == 0  # the bucket's one token
        waiting = tasks.call.delay(1, 0.1)  # handed a permit; its token 6 s away
        a.wait_for_log(waiting.id)
        time.sleep(0.5)
        assert len(holders(locks, "api")) == 1  # its reserved permit
        cut = time.monotonic()
        fault_proxy.cut()
        assert waiting.get(timeout=LOCK_TTL + 15) == 1
        took = time.monotonic() - cut
    _ran_once_each_and_nothing_held(locks)
    assert took < LOCK_TTL / 2, f"the run waited {took:.1f}s: its permit stayed reserved"
