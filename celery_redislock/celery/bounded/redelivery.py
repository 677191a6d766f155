"""A second message of a parked run whose park token was consumed: skipped while its
first run lives or after it ended, run when that run died (#24).

Two messages of one parked run exist when a broker hands out again the message of a
worker that died unacknowledged (``acks_late``: ``delivery_info["redelivered"]``), or
when the run's reservation lapsed before it started and the sweeper published it
again. Redis says which case it is (:func:`~celery_redislock.core.redelivery.retake`):

* the first run **ended** (or was parked again): the copy is dropped;
* its permit is **live**: a re-publish of ours is dropped at once (its first message
  runs); a broker's redelivery looks again once that permit would have lapsed unless
  renewed -- renewed, the first run is alive and the copy is dropped; not renewed,
* the first run is **dead** (its worker was killed, its permit lapsed unrenewed): the
  copy is the run now, on a permit under the entry's id (so a third message finds it
  live), or, with no permit free, is parked again.

Only a broker's redelivery whose first run is alive is a second delivery to warn the
operator about; a re-publish of ours is the same run (INFO, never WARNING).

May import the core and the shared glue.
"""

from __future__ import annotations

import time
from typing import Final

from celery.app.task import Context

from ...core import Lease
from ...core.lease import OnLost
from ...core.parking import ParkingSemaphore
from ...core.redelivery import ALIVE, ENDED, RETAKEN, retake
from ..execution import AnyTask, RunState
from ..logs import PERMIT
from .reschedule import skip_duplicate
from .settings import taken_memory

__all__ = ["RECHECK_MARGIN", "second_message"]

RECHECK_MARGIN: Final = 0.25
"""Seconds past the first run's permit expiry at which a redelivered copy looks again:
a live holder renews a third of a lease ahead, so a permit still there then was
renewed."""


def second_message(
    task: AnyTask,
    run: RunState,
    sem: ParkingSemaphore,
    entry_id: str,
    owner: str,
    *,
    ttl: float,
    on_lost: OnLost,
) -> Lease | None:
    """This message's permit when it is the run now; None when it must park again;
    else it is skipped (``Ignore`` raised, logged and signalled)."""
    request = task.request
    redelivered = _redelivered(request)
    memory = taken_memory(task.app)
    status, lease, left = retake(
        sem, entry_id, owner, ttl=ttl, memory=memory, renew=True, on_lost=on_lost
    )
    if status == ALIVE and redelivered:
        # Alive, or dead for less than a lease: look again once the permit would have
        # lapsed unrenewed (its holder renews it ahead of that while it lives) -- its
        # own time left, which a per-call lock_ttl makes longer than the task's: woken
        # at the task's, a dead run's permit would still be there, taken for a live one.
        time.sleep(left + RECHECK_MARGIN)
        status, lease, left = retake(
            sem, entry_id, owner, ttl=ttl, memory=memory, renew=True, on_lost=on_lost
        )
    if status == RETAKEN:
        PERMIT.warning(
            "celery_redislock: %s[%s] %s after the run of its first message died "
            "(its permit of pool %r lapsed unrenewed): it runs now",
            task.name,
            run.task_id,
            "delivered again" if redelivered else "published again",
            sem.name,
        )
        return lease
    if status == ALIVE:
        if redelivered:
            skip_duplicate(task, run, sem.name, _DELIVERED_TWICE)
        skip_duplicate(task, run, sem.name, _PUBLISHED_RUNNING)
    if status == ENDED:
        skip_duplicate(task, run, sem.name, _ENDED)
    PERMIT.info(
        "celery_redislock: %s[%s] %s after the run of its first message died; no "
        "permit of pool %r is free: parked again",
        task.name,
        run.task_id,
        "delivered again" if redelivered else "published again",
        sem.name,
    )
    return None


_DELIVERED_TWICE: Final = (
    "is a second message of a parked run of pool %r whose first message's run is "
    "alive (its permit renewed): skipped"
)
_PUBLISHED_RUNNING: Final = (
    "was published again (its reservation lapsed) but its first message's run of pool "
    "%r is going: this copy dropped"
)
_ENDED: Final = "is another message of a parked run of pool %r that ran already: dropped"


def _redelivered(request: Context) -> bool:
    return bool((request.delivery_info or {}).get("redelivered"))
