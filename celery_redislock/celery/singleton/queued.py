"""``singleton_mode="until_and_while_executing"``: one copy queued, one running.

Two locks per signature (sidekiq-unique-jobs' mode of that name): the *queued* lock
(:func:`.lookup.queued_key`), taken by ``apply_async`` like any enqueue lock -- so
``on_duplicate`` applies between queued copies, and ``"replace"`` swaps the queued copy
for the newest call -- and the *running* lock (the signature's key), taken when a run
starts. A run that got the running lock lets its queued lease go, so the next call may
queue. A run that starts while another copy runs keeps its queued lease and is re-sent
(``reschedule_countdown``): it is the one queued copy and runs next. A run whose queued
lease another call took over (``"replace"``) is skipped: the newer copy carries the
newest arguments. So a burst of calls with ``on_duplicate="replace"`` runs the body at
most twice: the copy running when it began, and the last one.
"""

from __future__ import annotations

from ...core import Lease
from ..execution import AnyTask, RunState
from ..tokens import KEY_HEADER, TOKEN_HEADER, queued_owner
from .duplicates import runtime_duplicate
from .leases import extend_token, lock_for, release_token
from .lookup import queued_key
from .options import SingletonOptions

__all__ = ["MODE", "leave_queue", "wait_in_queue"]

MODE = "until_and_while_executing"
"""The ``singleton_mode`` this module implements."""


def wait_in_queue(
    task: AnyTask,
    run: RunState,
    key: str,
    holder: str | None,
    options: SingletonOptions,
    token: str | None,
) -> None:
    """The running lock is held by another copy: stay the queued copy and come back
    later (re-sent, keeping the queued lease), or be skipped when a newer call holds
    the queued lock. Without a queued lease (``send_task``) it is an ordinary runtime
    duplicate. Always raises ``Ignore``."""
    if token is not None:
        qlock = lock_for(task, queued_key(key), options)
        ttl = options.queued_ttl + options.reschedule_countdown
        if not extend_token(qlock, token, ttl):  # replaced, or lapsed in the queue
            lease, _ = qlock.try_acquire(owner=queued_owner(run.task_id), ttl=ttl)
            if lease is None:  # a newer copy is queued: it runs next, not this one
                runtime_duplicate(task, run, key, holder, options, action="skip")
            assert lease is not None
            token = lease.token
        runtime_duplicate(
            task,
            run,
            key,
            holder,
            options,
            action="reschedule",
            headers_kept={TOKEN_HEADER: token, KEY_HEADER: key},
        )
    runtime_duplicate(task, run, key, holder, options)


def leave_queue(
    task: AnyTask,
    run: RunState,
    key: str,
    lease: Lease,
    options: SingletonOptions,
    token: str | None,
) -> None:
    """The run holds the running lock: give its queued lease back so the next call may
    queue. If a newer call took the queued lock over meanwhile (``"replace"``), this
    copy is stale: the running lock is released and the run skipped (``Ignore``)."""
    if token is None:
        return
    qlock = lock_for(task, queued_key(key), options)
    if release_token(qlock, token):
        return
    newer = qlock.info().owner if hasattr(qlock, "info") else None
    if newer is not None:
        lease.release()
        runtime_duplicate(task, run, key, newer, options, action="skip")
