"""The producer's side of the singleton lock: ``RedisLockTask.apply_async``.

Reached by ``delay``, ``apply_async``, signatures, chains, groups, chords, link
callbacks, ``retry()`` and beat (for tasks registered in beat's process). In order:

1. the key is computed first (a bad call raises ``TypeError``, an argument the
   serializer cannot encode ``ConfigurationError``), before anything touches Redis;
2. ``retry()`` of a running copy (same task id, from inside the run) hands the running
   lease to the retry message, kept through the countdown (:meth:`..execution.Hold.on_retry`);
3. a re-send of a message whose run died (Celery's ``retry_on_worker_lost`` publishes
   it from the worker's main process, with the old headers) takes over the dead run's
   lease, which nothing else would release before it expires;
4. otherwise the lock is taken for the queue (``lock_queued_ttl`` + countdown/ETA),
   owned by the task id, and its token travels in the message headers;
5. a duplicate gets ``on_duplicate``. If publishing fails the lease is released and
   the exception re-raised.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from celery.result import AsyncResult
from celery.utils import uuid

from ...core import Lease
from ..bounded.parking import SENT_HEADER
from ..execution import AnyTask, RunState, current_run
from ..options import options_of
from ..signals import singleton_acquired, singleton_released
from ..tokens import (
    HEADERS,
    KEY_HEADER,
    NONCE_HEADER,
    TOKEN_HEADER,
    parse_owner,
    queued_owner,
    run_token,
)
from .duplicates import enqueue_duplicate, revoke_replaced
from .leases import lock_for
from .lookup import queued_key
from .options import SingletonOptions
from .percall import BYPASS_HEADER, LOCK_TTL_HEADER, NO_CALL_OPTIONS, CallOptions
from .signature import call_key

__all__ = ["Publish", "apply_async", "delay_of"]

logger = logging.getLogger(__name__)

Publish = Callable[[str, dict[str, Any]], "AsyncResult[Any]"]
"""Publishes the message: ``publish(task_id, headers)`` -> ``AsyncResult``."""

_ATTEMPTS = 3  # acquire attempts when "replace" frees the lock and others race for it


def delay_of(task: AnyTask, options: Mapping[str, Any]) -> float:
    """Seconds until the message may run: its ``countdown``, or ``eta`` minus now."""
    countdown, eta = options.get("countdown"), options.get("eta")
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        return max(0.0, float(countdown))
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    if isinstance(eta, datetime):
        if eta.tzinfo is None:  # Celery reads a naive ETA in the app's timezone
            eta = eta.replace(tzinfo=task.app.timezone)
        return max(0.0, (eta - datetime.now(timezone.utc)).total_seconds())
    return 0.0


def apply_async(
    task: AnyTask,
    publish: Publish,
    args: Any,
    kwargs: Any,
    task_id: str | None,
    options: dict[str, Any],
    call: CallOptions = NO_CALL_OPTIONS,
) -> AsyncResult[Any] | None:
    """Take the singleton lock and publish, or apply ``on_duplicate``; ``call`` holds
    the per-call options (see :mod:`.percall`)."""
    every = options_of(task)
    every.bounded.check_call(task, args, kwargs)  # a concurrency_key that cannot take them
    opts = every.singleton
    headers = dict(options.get("headers") or {})
    # retry() copies the running request's headers: ours are never trusted as given.
    inherited = {name: headers.pop(name) for name in HEADERS if name in headers}
    if call is not NO_CALL_OPTIONS:
        opts = _with_call_options(opts, call, headers)
    key = None
    if opts.enabled and BYPASS_HEADER not in headers:
        key = call_key(task, args, kwargs, options, opts)
    delay = delay_of(task, options)
    if every.bounded.enabled:  # a parked run takes its place in the queue by it
        headers[SENT_HEADER] = f"{time.time() + delay:.6f}"
    if not task_id:  # a new call: never a retry, which reuses the running id
        task_id = uuid()
    else:
        run = current_run(task)
        if run is not None and run.task_id == task_id and not run.finished:
            return _publish_retry(run, publish, task_id, key, delay, headers)
    if key is None:
        return publish(task_id, headers)
    in_queue = opts.mode == "until_and_while_executing"  # a queued lock of its own
    lock_key = queued_key(key) if in_queue else key
    lock = lock_for(task, lock_key, opts)
    ttl = opts.queued_ttl + delay
    seed = inherited.get(TOKEN_HEADER) or inherited.get(NONCE_HEADER)
    if seed and opts.lock_while_running and not in_queue:
        dead = lock.adopt(run_token(seed), owner=queued_owner(task_id), ttl=ttl)
        if dead is not None:
            return _publish_locked(task, publish, task_id, key, dead, headers)
    if not opts.lock_at_enqueue:
        return publish(task_id, headers)
    replaced: list[str] = []
    for attempt in range(_ATTEMPTS):
        lease, holder = lock.try_acquire(owner=queued_owner(task_id), ttl=ttl)
        if lease is not None:
            result = _publish_locked(task, publish, task_id, key, lease, headers)
            revoke_replaced(task, replaced)
            return result
        may_replace = opts.on_duplicate == "replace" and attempt < _ATTEMPTS - 1
        existing_id, running = parse_owner(holder)
        if may_replace and running is False and existing_id != task_id:
            assert holder is not None and existing_id is not None
            # Owner-checked: refused (0) if the copy started (its owner is then
            # "<id>@...") or the lock changed hands meanwhile; then look again.
            if lock.release_owner(holder):
                replaced.append(existing_id)
            continue
        return enqueue_duplicate(task, opts, lock_key, task_id, holder, options)
    raise AssertionError("unreachable: the last attempt never replaces")  # pragma: no cover


def _with_call_options(
    opts: SingletonOptions, call: CallOptions, headers: dict[str, Any]
) -> SingletonOptions:
    """The task's options with this call's over them; what the run needs goes in
    ``headers`` (``retry()`` and re-sends keep them)."""
    if call.singleton is False:
        headers[BYPASS_HEADER] = "1"
    if call.lock_ttl is not None:
        headers[LOCK_TTL_HEADER] = repr(call.lock_ttl)
    changes: dict[str, Any] = {}
    if call.on_duplicate is not None:
        changes["on_duplicate"] = call.on_duplicate
    if call.queued_ttl is not None:
        changes["queued_ttl"] = call.queued_ttl
    # The caches (locks, call keys) are shared: they do not depend on these two.
    return dataclasses.replace(opts, **changes) if changes else opts


def _publish_locked(
    task: AnyTask,
    publish: Publish,
    task_id: str,
    key: str,
    lease: Lease,
    headers: dict[str, Any],
) -> AsyncResult[Any]:
    headers[TOKEN_HEADER], headers[KEY_HEADER] = lease.token, key
    singleton_acquired.send(
        sender=task, task_id=task_id, key=key, fence=lease.fence, stage="enqueue"
    )
    try:
        return publish(task_id, headers)
    except BaseException:
        released = lease.release()
        singleton_released.send(
            sender=task,
            task_id=task_id,
            key=key,
            reason="publish-failed",
            released=released,
            stage="enqueue",
        )
        raise


def _publish_retry(
    run: RunState,
    publish: Publish,
    task_id: str,
    key: str | None,
    delay: float,
    headers: dict[str, Any],
) -> AsyncResult[Any]:
    for hold in run.holds:
        hold.on_retry(key, delay, headers)
    try:
        result = publish(task_id, headers)
    except BaseException:
        for hold in run.holds:
            hold.on_retry_failed()
        raise
    for hold in run.holds:
        hold.on_retry_published()
    return result
