"""Parking at send: a run of a rate-limited task over its rate is parked by
``apply_async`` itself, so it is published once, at its admission time.

A run refused at its start is parked and published again when admitted: two publishes
for one run. The sender can do better: in one script call (``park.lua``, handing the
admission over) it reserves an admission for the run when the limiter admits it now
and nobody is parked before it -- the message is published at once, carrying its park
token, and its run takes that admission when it starts -- or parks it in the limiter's
queue, from which a worker's pump (:mod:`.pump`) publishes it at its admission time.
Either way one publish per run.

Only for a plain call: not for a singleton (whose lock is taken at send), a task with
a concurrency limit too (its guards decide when it starts), a countdown or ETA, a
``retry()``, or eager mode. If the lock Redis does not answer, the message is
published as usual and its run is admitted (or parked) when it starts.

May import the core, the shared glue and the bounded feature's parking.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.result import AsyncResult
from celery.utils import uuid

from ...core.parking import HANDED_OVER, new_entry_id
from ..bounded.journal import record
from ..bounded.parking import ATTEMPT, encode_message, park_header
from ..execution import AnyTask, current_run
from ..options import options_of
from ..singleton.enqueue import delay_of
from .guard import RATE_PARK_HEADER, limited
from .options import rate_options
from .pump import poke
from .queues import rate_queue, rate_spec

__all__ = ["park_at_send"]

logger = logging.getLogger(__name__)


def park_at_send(
    task: AnyTask, args: Any, kwargs: Any, task_id: str | None, options: dict[str, Any]
) -> tuple[AsyncResult[Any] | None, str | None, dict[str, Any]]:
    """``(result, task_id, options)``: ``result`` the parked run's ``AsyncResult`` (it is
    not published now), else None and the task id and options to publish with (its
    admission reserved under the park token in its headers, or untouched)."""
    rates = rate_options(task)
    if not rates.enabled or task.app.conf.task_always_eager:
        return None, task_id, options
    run = current_run(task)
    if run is not None and task_id is not None and run.task_id == task_id:
        return None, task_id, options  # a retry(): the next attempt's start decides
    try:
        every = options_of(task)
        if every.singleton.enabled or every.bounded.enabled or delay_of(task, options) > 0:
            return None, task_id, options
        pool = rates.pool(task, args, kwargs)
        queue = rate_queue(task.app, pool, rates.rates)
        task_id = task_id or uuid()
        entry_id, since = new_entry_id(), time.time()
        headers = dict(options.get("headers") or {})
        headers[RATE_PARK_HEADER] = park_header(entry_id, options.get("retries"), since)
        sent = {**options, "task_id": task_id, "headers": headers}
        payload = encode_message(task, args, kwargs, sent)
        spec = rate_spec(queue, rates.rates)
    except Exception as exc:
        return _not_parked(task, exc, task_id, options)
    try:
        record(task.app, entry_id, payload, spec=spec, owner=task_id)  # survives the lock Redis
        position = queue.park(entry_id, payload, owner=task_id, intake=True, hand_over=True)
    except Exception as exc:
        # The park may have gone through (its reply lost), and the journal has it: the
        # run parks again under the same token when it starts (a re-sent park changes
        # nothing), never under a new one beside it.
        attempt = {**(options.get("headers") or {}), ATTEMPT: entry_id}
        return _not_parked(task, exc, task_id, {**options, "headers": attempt})
    if position == HANDED_OVER:  # admitted now: published with its park token
        return None, task_id, {**options, "headers": headers}
    limited(task, task_id, pool, rates, position, 0.0)
    poke(task.app)
    return AsyncResult(task_id, app=task.app), task_id, options


def _not_parked(
    task: AnyTask, exc: Exception, task_id: str | None, options: dict[str, Any]
) -> tuple[None, str | None, dict[str, Any]]:
    logger.debug(
        "celery_redislock: %s not parked at send (%s: %s); its run is admitted when it starts",
        task.name,
        type(exc).__name__,
        exc,
    )
    return None, task_id, options
