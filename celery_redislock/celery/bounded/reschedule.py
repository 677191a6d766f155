"""What a run refused a permit does instead of running: it is parked in its pool's queue,
or re-sent with a jittered countdown, or (a second message of a parked run that started
already) skipped. Each ends the current message with ``Ignore``. Used by :mod:`.guard`.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Final

import celery.app.task as celery_task_module
from celery import states
from celery.app.task import Context
from celery.exceptions import Ignore

from ...core.parking import ParkingSemaphore
from ..execution import AnyTask, RunState
from ..logs import PERMIT, mark_resent_by, quiet_ignored
from ..signals import permit_duplicate, permit_rescheduled
from .options import BoundedOptions
from .parking import leave_queues, park_run, queues_left

__all__ = ["WAIT_HEADER", "park", "reschedule", "skip_duplicate"]

WAIT_HEADER: Final = "redislock_permit_wait"
"""Header of a re-scheduled message: ``"<first refusal, epoch s> <re-schedules>
<retries>"``, so the run that finally gets a permit can report how long it waited.
Not one of :data:`~..tokens.HEADERS` (``apply_async`` would drop it); ``retry()``
copies it, which the retries count in it tells apart."""
mark_resent_by(WAIT_HEADER)  # a re-scheduled copy: its receipt is not logged again


def skip_duplicate(task: AnyTask, run: RunState, pool: str, why: str) -> None:
    """A second message of a parked run whose park token was taken: never runs.
    ``why`` (a format of the pool's name) says why; a WARNING only for a broker's
    second delivery of a run that is alive (see :mod:`.redelivery`), INFO otherwise:
    a copy we published again is the same run, not a duplicate delivery."""
    level = logging.WARNING if why.startswith("is a second message") else logging.INFO
    PERMIT.log(level, "celery_redislock: %s[%s] " + why, task.name, run.task_id, pool)
    permit_duplicate.send(sender=task, task_id=run.task_id, key=pool)
    quiet_ignored(run.task_id)  # logged above: Celery's "ignored" line would repeat it
    raise Ignore()


def park(task: AnyTask, run: RunState, sem: ParkingSemaphore, since: float, limit: int) -> None:
    """Park the run in its pool's queue (see :mod:`.parking`); always raises Ignore."""
    request = task.request
    if _tracks_started(task, request):
        # The worker stored STARTED before this hook ran; the task waits again.
        # Before parking: its next run's own STARTED must never be overwritten.
        task.backend.store_result(run.task_id, None, states.PENDING, request=request)
    park_run(task, run, sem, since, limit)
    raise Ignore()


def reschedule(
    task: AnyTask,
    run: RunState,
    pool: str,
    limit: int,
    options: BoundedOptions,
    since: float,
    rescheduled: int,
) -> None:
    """Publish this run's message again in a jittered countdown; always raises Ignore."""
    request = task.request
    countdown = options.countdown + random.uniform(0.0, options.jitter)
    sig = task.signature_from_request(request, countdown=countdown)
    message = dict(sig.options)
    # A run another guard's queue published (the rate's: it was admitted) leaves that
    # queue as a parked one does (see park_run): its admission given back, it is
    # charged when it really starts; the copy, without that queue's token, is decided
    # afresh there (#25).
    leaving = queues_left(request)
    headers = {k: v for k, v in (message.get("headers") or {}).items() if k not in leaving}
    headers[WAIT_HEADER] = f"{since:.3f} {rescheduled + 1} {request.retries or 0}"
    message["headers"] = headers
    # Out of the other queue before the copy exists: once the copy is out, a claim
    # lapsing there would publish a second one. Before the state is stored: a second
    # message of a run that started ends here (Ignore), its state left alone.
    leave_queues(task, leaving)
    if _tracks_started(task, request):
        # The worker stored STARTED before this hook ran; the task is queued again.
        # Before the publish: the copy's own STARTED must never be overwritten.
        task.backend.store_result(run.task_id, None, states.PENDING, request=request)
    # Same task id, from inside the run: RedisLockTask.apply_async treats it as a
    # retry() of this run, so a singleton lock is handed over to the copy (see
    # enqueue.py); same ``retries``, so max_retries is not spent. Not a child of this
    # run (add_to_parent=False): its result would list the copy, and the kept
    # AsyncResult would keep Celery's result subscription (Redis backend, pools whose
    # join does not block) after the run.
    task.apply_async(sig.args, sig.kwargs, add_to_parent=False, **message)
    PERMIT.info(
        "celery_redislock: %s[%s] over the limit of pool %r (%d): re-sent to run in %.2fs",
        task.name,
        run.task_id,
        pool,
        limit,
        countdown,
    )
    permit_rescheduled.send(
        sender=task,
        task_id=run.task_id,
        key=pool,
        limit=limit,
        countdown=countdown,
        rescheduled=rescheduled + 1,
        waited=max(0.0, time.time() - since),
    )
    quiet_ignored(run.task_id)  # logged above: Celery's "ignored" line would repeat it
    raise Ignore()


def _tracks_started(task: AnyTask, request: Context) -> bool:
    """True when the worker stored STARTED before ``before_start`` (as the tracer decides)."""
    if not task.track_started:
        return False
    # celery >= 5.6: the request's own ignore_result, when given, wins over the task's.
    actual = getattr(celery_task_module, "get_actual_ignore_result", None)
    return not (actual(task, request) if actual is not None else task.ignore_result)
