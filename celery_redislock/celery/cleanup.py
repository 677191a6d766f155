"""Signal receivers: the worker's main process cleans up after runs that could not.

A run releases its own holds in ``__call__`` (see :mod:`.execution`). When it cannot,
the worker's main process does, by token (owner-checked: a lock that changed hands
is never touched), through Celery's signals (celery 5.7, prefork):

========================================= =============================================
``task_received`` (main process)          stamps a nonce on messages without a token
                                          and remembers each message's headers
``task_revoked`` (main process)           revoked/expired before start: the queued
                                          lease; ``terminate=True``: the run's lease
``task_failure(WorkerLostError)`` (main)  the child died: the run's lease
``task_failure(TimeLimitExceeded)`` (main) hard time limit: the run's lease (the main
                                          process has no request headers there, hence
                                          the remembered ones)
``task_postrun`` (child)                  safety net: holds not given back yet
========================================= =============================================

With ``acks_late`` and ``reject_on_worker_lost`` Celery sends no signal when a child
dies (the message is simply requeued), so the dead run's lease expires after
``lock_ttl``. Receivers are connected once per process (``dispatch_uid``) and act on
``RedisLockTask`` senders only.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import signals

from .execution import AnyTask, Cleanup, Guard, current_run
from .tokens import HEADERS, NONCE_HEADER, TOKEN_HEADER

if TYPE_CHECKING:
    from celery.app.task import Context
    from celery.worker.request import Request

__all__ = ["MAX_REMEMBERED", "connect", "guards_of"]

logger = logging.getLogger(__name__)

MAX_REMEMBERED: Final = 4096
"""Messages whose headers the main process remembers (oldest forgotten first); a run
forgotten before its hard time limit keeps its lock until ``lock_ttl`` runs out."""

_remembered: OrderedDict[str, tuple[dict[str, str], ...]] = OrderedDict()
_remembered_lock = threading.Lock()


def guards_of(task: object) -> tuple[Guard, ...]:
    """The guards of a ``RedisLockTask`` (empty for any other task)."""
    guards = getattr(task, "redislock_guards", None)
    return guards if isinstance(guards, tuple) else ()


def _our_headers(headers: Any) -> dict[str, str]:
    # Every redislock_* header (the Cleanup contract), not only HEADERS: a parked run's
    # park token (redislock_park) too, which the bounded guard needs when it is revoked.
    return (
        {
            k: v
            for k, v in headers.items()
            if k in HEADERS or (isinstance(k, str) and k.startswith("redislock_"))
        }
        if headers
        else {}
    )


def _on_received(sender: object = None, request: Request | None = None, **_: object) -> None:
    # sender: the worker's consumer
    task: AnyTask | None = getattr(request, "task", None)
    guards = guards_of(task)
    if not guards or task is None or request is None:
        return
    message = request.request_dict
    if TOKEN_HEADER not in message and NONCE_HEADER not in message:
        # Every run then has an execution token this process can recompute. The dict
        # is the one the pool hands to the child, where it shows in request.headers.
        message[NONCE_HEADER] = secrets.token_hex(12)
    with _remembered_lock:
        previous = _remembered.pop(request.id, ())
        _remembered[request.id] = (*previous[-3:], _our_headers(message))
        while len(_remembered) > MAX_REMEMBERED:
            _remembered.popitem(last=False)
    for guard in guards:
        guard.received(task, request)


def _forget(task_id: str) -> tuple[dict[str, str], ...]:
    with _remembered_lock:
        return _remembered.pop(task_id, ())


def _dispatch(task: AnyTask, event: Cleanup) -> None:
    for guard in guards_of(task):
        try:
            guard.cleanup(task, event)
        except Exception:
            logger.exception(
                "celery_redislock: cleanup after %s of %s[%s] failed; its "
                "leases expire by themselves",
                event.event,
                task.name,
                event.task_id,
            )


def _on_revoked(
    sender: AnyTask | None = None,
    request: Context | None = None,  # the run's context, not the worker's Request
    terminated: bool = False,
    **_: object,
) -> None:
    if sender is None or not guards_of(sender) or request is None or not request.id:
        return
    # The revoked message's own headers too: one revoked (or expired) on receipt was
    # never remembered, and what is may be an earlier delivery's (a parked run's first).
    own = _our_headers(request.headers)
    remembered = _forget(request.id)
    deliveries = remembered if own in remembered else (*remembered, own)
    event = "terminated" if terminated else "revoked"
    _dispatch(sender, Cleanup(request.id, event, deliveries, request.args, request.kwargs))


def _on_failure(
    sender: AnyTask | None = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: object,
) -> None:
    if not isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
        return  # an ordinary failure: the run released in __call__
    if sender is None or not guards_of(sender) or not task_id:
        return
    deliveries = _forget(task_id)
    if not deliveries:  # celery 5.7 pushes the request for WorkerLostError
        request = sender.request_stack.top
        headers = getattr(request, "headers", None) if request is not None else None
        deliveries = (_our_headers(headers),)
    event = "worker-lost" if isinstance(exception, WorkerLostError) else "time-limit"
    _dispatch(sender, Cleanup(task_id, event, deliveries, args, kwargs))


def _on_postrun(sender: AnyTask | None = None, state: str | None = None, **_: object) -> None:
    if sender is None or not guards_of(sender):
        return
    run = current_run(sender)
    if run is not None and not run.finished:
        # before_start took something but __call__ never ran (or the child is being
        # terminated: state None). Release now rather than wait for the TTL.
        run.finish(state or "TERMINATED")


def connect() -> None:
    """Connect the receivers (idempotent: each has a ``dispatch_uid``)."""
    signals.task_received.connect(
        _on_received, weak=False, dispatch_uid="celery_redislock.received"
    )
    signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="celery_redislock.revoked")
    signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="celery_redislock.failure")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="celery_redislock.postrun")
