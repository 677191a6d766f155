"""The example's Celery app: three tasks that must not run too much at once.

Broker, result backend and locks all live on the Redis at ``$REDIS_URL``.
``python -m example_project`` sets it (and starts everything); to run the pieces
yourself, against your own Redis::

    export REDIS_URL=redis://localhost:6379/0
    celery -A example_project.app worker -n worker-a@%h -c 3
    celery -A example_project.app beat
    celery -A example_project.app redislock list

``$EXAMPLE_NAMESPACE`` (default ``example``) names the queue, the lock key prefix and
the records, so runs of the example sharing one Redis never see each other's keys.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_redislock import bounded_task, singleton_task
from celery_redislock.celery.signals import (
    permit_parked,
    permit_rescheduled,
    singleton_duplicate,
)

from .records import Recorder

__all__ = [
    "NAMESPACE",
    "PARTNER_API_LIMIT",
    "REDIS_URL",
    "REPORT_EVERY",
    "REPORT_SECONDS",
    "app",
    "call_partner_api",
    "count_duplicate",
    "count_parked",
    "count_rescheduled",
    "nightly_report",
    "recorder",
    "sync_user",
]

REDIS_URL: str = os.environ.get("REDIS_URL", "")
"""Broker, results and locks: one Redis."""
if not REDIS_URL:
    raise RuntimeError(
        "example_project.app needs REDIS_URL (e.g. redis://localhost:6379/0); "
        "`python -m example_project` sets it for you"
    )

NAMESPACE: str = os.environ.get("EXAMPLE_NAMESPACE", "example")
"""Queue name, lock key prefix and records key prefix of this run of the example."""

REPORT_EVERY = 1.0
"""Seconds between two beat ticks of ``nightly_report``."""

REPORT_SECONDS = 2.5
"""How long ``nightly_report`` runs: longer than beat's period, on purpose."""

SYNC_SECONDS = 1.2
"""How long ``sync_user`` runs."""

PARTNER_API_LIMIT = 3
"""At most this many ``call_partner_api`` run at once, across all workers."""

PARTNER_API_SECONDS = 1.0
"""How long one partner API call takes."""

app = Celery("example_project", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    # celery_redislock's settings. redislock_url defaults to the broker's Redis, so it
    # is spelled out only to show where the locks live.
    redislock_url=REDIS_URL,
    redislock_prefix=NAMESPACE,
    redislock_lock_ttl=10,  # a crashed worker's locks and permits free within 10 s
    # Celery's own.
    task_default_queue=NAMESPACE,
    worker_prefetch_multiplier=1,  # long tasks: a worker takes only what it can run
    result_expires=600,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "nightly-report": {"task": "example_project.app.nightly_report", "schedule": REPORT_EVERY},
    },
)

recorder = Recorder(redis.Redis.from_url(REDIS_URL), NAMESPACE)
"""Where the tasks write down their runs and the receivers below their counts."""


# 1. A scheduled job that beat fires again while the last run still goes on. The
#    lock is taken when beat sends the task: an extra tick gets the running copy's
#    AsyncResult back instead of queueing a second report (logged and signalled).
@singleton_task(app=app)
def nightly_report() -> str:
    """Build the (pretend) nightly report; it takes longer than beat's period."""
    with recorder.run("nightly_report"):
        time.sleep(REPORT_SECONDS)
    return "report built"


# 2. A "refresh X" task that many requests enqueue. The lock is per signature, so
#    different users sync in parallel and one user never twice at once; a repeat
#    call returns the AsyncResult of the copy already queued or running.
@singleton_task(app=app)
def sync_user(user_id: int) -> str:
    """Sync one user's data from the (pretend) upstream system."""
    with recorder.run(f"sync_user({user_id})"):
        time.sleep(SYNC_SECONDS)
    return f"user {user_id} synced"


# 3. A rate-limited API: at most PARTNER_API_LIMIT calls at once across every worker.
#    A run over the limit waits a moment for a permit; rather than tie up its worker
#    process longer, it then goes back to the queue (same task id, not counted as a
#    retry) and runs a little later.
@bounded_task(app=app, concurrency_limit=PARTNER_API_LIMIT, concurrency_key="partner-api")
def call_partner_api(n: int) -> int:
    """Call the (pretend) partner API for item ``n``; returns ``n``."""
    with recorder.run("partner-api"):
        time.sleep(PARTNER_API_SECONDS)
    return n


# Every duplicate and every parked or re-scheduled run is logged by celery_redislock
# and signalled; these receivers count them, in whichever process sent the signal.
@singleton_duplicate.connect
def count_duplicate(sender: Any, stage: str, action: str, **kwargs: Any) -> None:
    """Count a refused copy of a singleton task: ``duplicate:<stage>:<action>``."""
    recorder.count(sender, f"duplicate:{stage}:{action}")


@permit_parked.connect
def count_parked(sender: Any, **kwargs: Any) -> None:
    """Count a bounded run parked in its pool's queue in Redis because the pool was
    full (the default: published again when a permit frees)."""
    recorder.count(sender, "parked")


@permit_rescheduled.connect
def count_rescheduled(sender: Any, **kwargs: Any) -> None:
    """Count a bounded run sent back to the queue because the pool was full."""
    recorder.count(sender, "rescheduled")
