"""Duplicates: a call whose signature's lock another copy holds.

* At enqueue (:func:`enqueue_duplicate`), ``on_duplicate`` decides: ``"existing"``
  returns the other copy's ``AsyncResult``, ``"raise"`` raises ``DuplicateTask``,
  ``"drop"`` returns None; ``"replace"`` is done by the caller while the other copy is
  queued, and is ``"existing"`` once it runs. A member of a group, chord or chain
  always raises: another copy's result would leave its canvas waiting for an id it
  does not know.
* At run time (:func:`runtime_duplicate`), ``on_running_duplicate`` decides: skip
  (``Ignore``) or re-send with a countdown. Either way the copy holds nothing, so it
  releases nothing. Every duplicate is logged and signalled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery.exceptions import Ignore
from celery.result import AsyncResult
from celery.states import PENDING, READY_STATES
from redis.cluster import RedisCluster

from ...core import RedisLock
from ...core.clients import key_node
from ...errors import DuplicateTask
from ..execution import AnyTask, RunState, resend
from ..logs import DUPLICATE, quiet_ignored
from ..options import options_of
from ..signals import singleton_duplicate
from ..tokens import RECHECK_HEADER, parse_owner
from .leases import lock_for
from .lookup import ttl_left
from .options import SingletonOptions

__all__ = ["enqueue_duplicate", "holder_state", "revoke_replaced", "runtime_duplicate"]


def holder_state(
    task: AnyTask, options: SingletonOptions, existing_id: str | None, running: bool | None
) -> str:
    """What the copy holding the lock is doing, for a refusal's message: ``"running"``,
    ``"queued"`` or ``"holding the lock"`` (a lock taken with the core API).

    In ``singleton_mode="interval"`` the lock outlives the run by ``singleton_interval``
    under the same (running) owner id, so "running" is said only while the holder's
    result is not ready; a finished one "finished; singleton_interval holds the lock"
    (#29 item 6). That asks the result backend, on a refusal in that mode only.
    """
    if not running:
        return "queued" if running is False else "holding the lock"
    if options.mode != "interval" or existing_id is None:
        return "running"
    interval = f"singleton_interval={options.interval:g}s"
    try:
        state = task.AsyncResult(existing_id).state
    except Exception:  # no result backend (or unreachable): cannot tell
        return f"running or finished within its {interval}"
    if state in READY_STATES:
        return f"finished ({state}); its {interval} holds the lock"
    if state == PENDING and (task.ignore_result or not task.app.conf.result_backend):
        return f"running or finished within its {interval}"
    return "running"


def revoke_replaced(task: AnyTask, task_ids: list[str]) -> None:
    """Revoke the queued copies ``on_duplicate="replace"`` took the lock from."""
    for task_id in task_ids:
        try:
            # Only workers that are up remember a revoke; a replaced copy that starts
            # anyway finds the lock taken by its replacement and is skipped.
            task.app.control.revoke(task_id)
        except Exception:
            DUPLICATE.warning(
                "celery_redislock: could not revoke replaced task %s[%s]",
                task.name,
                task_id,
                exc_info=True,
            )


def enqueue_duplicate(
    task: AnyTask,
    opts: SingletonOptions,
    key: str,
    task_id: str,
    holder: str | None,
    options: Mapping[str, Any],
) -> AsyncResult[Any] | None:
    """Apply ``on_duplicate`` to a call refused by ``holder`` (see the module docs)."""
    existing_id, running = parse_owner(holder)
    action = "existing" if opts.on_duplicate == "replace" else opts.on_duplicate
    canvas = next((o for o in ("group_id", "chord", "chain") if options.get(o)), None)
    if action in ("existing", "drop") and (canvas or existing_id is None):
        action = "raise"
    state = holder_state(task, opts, existing_id, running)
    singleton_duplicate.send(
        sender=task,
        task_id=task_id,
        key=key,
        existing_id=existing_id,
        action=action,
        stage="enqueue",
    )
    if action == "existing":
        DUPLICATE.info(
            "celery_redislock: %s[%s] not sent: %s[%s] with the same signature is "
            "%s; returning its result",
            task.name,
            task_id,
            task.name,
            existing_id,
            state,
        )
        assert existing_id is not None  # None was turned into "raise" above
        return task.AsyncResult(existing_id)
    if action == "drop":
        DUPLICATE.info(
            "celery_redislock: %s[%s] dropped: %s[%s] with the same signature is %s",
            task.name,
            task_id,
            task.name,
            existing_id,
            state,
        )
        return None
    why = (
        f" (a member of a {canvas.replace('_id', '')} cannot be replaced by another copy's "
        "result: its canvas would wait for an id it does not know)"
        if canvas
        else ""
    )
    left = ttl_left(lock_for(task, key, opts))  # what a caller needs to decide to retry
    raise DuplicateTask(
        f"task {task.name}[{task_id}] not sent: {task.name}[{existing_id}] with the same "
        f"signature is {state}{why}",
        task_id=existing_id,
        key=key,
        ttl_left=left,
    )


def runtime_duplicate(
    task: AnyTask,
    run: RunState,
    key: str,
    holder: str | None,
    options: SingletonOptions,
    action: str | None = None,
    headers_kept: dict[str, str] | None = None,
) -> None:
    """Skip or re-send a copy that found the lock held; always raises ``Ignore``.

    ``action`` forces ``"skip"`` or ``"reschedule"``; ``headers_kept`` go with a re-sent
    copy (mode ``until_and_while_executing``: its queued lease). A skipped copy with an
    id of its own ends ``FAILURE`` with :class:`DuplicateTask`, so ``.get()`` raises at
    once instead of waiting for ever (Celery's ``Ignore`` alone leaves it PENDING).
    """
    existing_id, running = parse_owner(holder)
    state = holder_state(task, options, existing_id, running)
    request = task.request
    headers = request.headers or {}
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    if action is not None:
        pass
    elif request.is_eager:
        action = "skip"
    elif existing_id == run.task_id:
        # The same message again. Either the broker redelivered it while its first run
        # still runs (visibility_timeout: running it later would run it twice), or its
        # child died and Celery requeued it (acks_late + reject_on_worker_lost, when no
        # signal tells the main process to release): the dead run's lease then expires
        # unrenewed. Look again when it would have lapsed (or after lock_ttl, if
        # sooner); a lease that ends later than it did was renewed: alive (#24).
        mark = headers.get(RECHECK_HEADER)
        if mark is None:
            action = "recheck" if redelivered else "skip"
        else:
            action = "recheck" if _unrenewed(task, key, options, mark) else "skip"
    else:
        action = options.on_running_duplicate
    if action == "skip":
        DUPLICATE.info(
            "celery_redislock: %s[%s] skipped: %s[%s] with the same signature is %s",
            task.name,
            run.task_id,
            task.name,
            existing_id,
            state,
        )
        if existing_id != run.task_id:  # never over the result of the copy that runs
            _store_skipped(task, run.task_id, key, existing_id, state)
    else:
        recheck = action == "recheck"
        countdown = options.reschedule_countdown
        extra = {}
        if recheck:
            end, left = _lease_end(task, key, options)
            countdown = min(options.lock_ttl, options.lock_ttl if left is None else left) + 0.5
            first = headers.get(RECHECK_HEADER)  # the first look's, kept across looks
            extra = {RECHECK_HEADER: str(first or ("1" if end is None else end))}
        resend(task, countdown, {**extra, **(headers_kept or {})})
        DUPLICATE.info(
            "celery_redislock: %s[%s] found %s[%s] %s; re-sent to run in %gs%s",
            task.name,
            run.task_id,
            task.name,
            existing_id,
            state,
            countdown,
            " (a redelivery: skipped then if its first run renewed the lock)" if recheck else "",
        )
        action = "reschedule"
    singleton_duplicate.send(
        sender=task,
        task_id=run.task_id,
        key=key,
        existing_id=existing_id,
        action=action,
        stage="run",
    )
    if not request.is_eager:
        quiet_ignored(run.task_id)  # logged above: Celery's "ignored" line would repeat it
    raise Ignore()


def _lease_end(
    task: AnyTask, key: str, options: SingletonOptions
) -> tuple[int | None, float | None]:
    """``(end, left)``: when the holder's lease of ``key`` ends unless renewed, in ms of
    the lock Redis's own clock, and the seconds it has left; ``(None, None)`` when the
    lock is free or over Redlock masters (no one clock)."""
    lock = lock_for(task, key, options)
    if not isinstance(lock, RedisLock):
        return None, None
    client = lock.client
    if isinstance(client, RedisCluster):  # the clock of the node the lease lives on
        node = key_node(client, lock.keys.key("holders"))
        seconds, micros = client.time(target_nodes=node)
    else:
        seconds, micros = client.time()
    left = ttl_left(lock)
    if left is None:
        return None, None
    return int(seconds) * 1000 + int(micros) // 1000 + int(left * 1000), left


def _unrenewed(task: AnyTask, key: str, options: SingletonOptions, mark: object) -> bool:
    """True when the holder's lease still ends when it did at the first look
    (``mark``, see :func:`_lease_end`): its holder has not renewed it since -- dead,
    or dead soon, not alive. A renewal moves the end a third of a lease or more; 50 ms
    allow for the two reads' round trips. A mark without a time (Redlock, or a copy
    re-sent before #24's review) is taken for a live holder's, as before."""
    try:
        first = int(str(mark))
    except ValueError:
        return False
    end, _ = _lease_end(task, key, options)
    return first > 1 and end is not None and end <= first + 50


def _store_skipped(
    task: AnyTask, task_id: str, key: str, existing_id: str | None, state: str
) -> None:
    """End a skipped copy ``FAILURE`` with ``DuplicateTask`` (errbacks and chords are
    told, as for any failure); nothing is stored when the task ignores its results."""
    request = task.request
    if request.is_eager or task.ignore_result or request.ignore_result:
        return
    left = ttl_left(lock_for(task, key, options_of(task).singleton))
    error = DuplicateTask(
        f"task {task.name}[{task_id}] skipped: {task.name}[{existing_id}] with the same "
        f"signature is {state}",
        task_id=existing_id,
        key=key,
        ttl_left=left,
    )
    task.backend.mark_as_failure(task_id, error, request=request)
