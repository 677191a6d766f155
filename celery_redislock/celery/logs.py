"""One event, one log line: the logger names and levels of the Celery layer.

Every event is logged once, by the layer that knows most about it, on a logger named
after what happened (stable names, whatever module logs them), at the level an
operator would pick:

=============================== ========= ============================================
logger                          level     events
=============================== ========= ============================================
``celery_redislock.duplicate``  INFO      a call refused at enqueue, a copy skipped or
                                          re-sent because another holds its lock
                                WARNING   a replaced copy could not be revoked
``celery_redislock.lease``      ERROR     a running task lost its lock or permit
                                WARNING   a queued lease had lapsed (the run takes the
                                          lock afresh)
                                INFO      a lock released by the worker's main process
                                          after revoke, time limit or a lost child
``celery_redislock.permit``     INFO      a run over its pool's limit re-published
                                DEBUG     a parked run took its permit
(parking: ``celery_redislock.celery.bounded.parking`` / ``.sweeper``, see there)
``celery_redislock.core.*``     WARNING   a lease with no ``on_lost`` callback lost
                                          (leases of tasks are reported above, once);
                                          a semaphore's stored limit changed
                                DEBUG     subscriber and renewal connection errors
=============================== ========= ============================================

Celery logs lines of its own for the same events: ``Task ...[id] received`` again for
a copy this package re-sent (the worker's main process, logger
``celery.worker.strategy``) and ``Task ...[id] ignored`` for a run this package ended
with ``Ignore`` after logging why (logger ``celery.app.trace``). Those two are dropped
by the filters below, for those messages only; every other Celery line is left alone.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Final

from celery.worker.request import Request

from .tokens import RESENT_HEADER

__all__ = [
    "DUPLICATE",
    "LEASE",
    "PERMIT",
    "QuietRequest",
    "install",
    "mark_resent_by",
    "quiet_ignored",
]

DUPLICATE: Final = logging.getLogger("celery_redislock.duplicate")
"""Duplicates refused, skipped or re-sent (INFO); a replaced copy not revoked (WARNING)."""

LEASE: Final = logging.getLogger("celery_redislock.lease")
"""Lost leases (ERROR), lapsed queued leases (WARNING), clean-up releases (INFO)."""

PERMIT: Final = logging.getLogger("celery_redislock.permit")
"""Concurrency permits: re-published runs (INFO), permits taken after parking (DEBUG)."""

_MAX: Final = 4096  # ids remembered per kind; a line not dropped is only noise
_lock = threading.Lock()
_quiet: dict[str, OrderedDict[str, None]] = {"received": OrderedDict(), "ignored": OrderedDict()}


def _remember(kind: str, task_id: str) -> None:
    with _lock:
        ids = _quiet[kind]
        ids[task_id] = None
        while len(ids) > _MAX:
            ids.popitem(last=False)


def _take(kind: str, task_id: Any) -> bool:
    with _lock:
        return _quiet[kind].pop(task_id, False) is None


def quiet_ignored(task_id: str) -> None:
    """Celery's ``Task ...[task_id] ignored`` line is not logged for the next ``Ignore``
    of ``task_id`` in this process: call it after logging why, before raising."""
    _remember("ignored", task_id)


_resent_markers: set[str] = {RESENT_HEADER}


def mark_resent_by(header: str) -> None:
    """Messages carrying ``header`` are copies this package re-sent (e.g. a bounded
    run's re-schedule): their receipt is not logged again."""
    _resent_markers.add(header)


class QuietRequest(Request):
    """The worker's request of a ``RedisLockTask``: notes a copy this package re-sent,
    before Celery logs its receipt (its ``received`` line is then dropped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not _resent_markers.isdisjoint(self.request_dict):
            _remember("received", self.id)


def _context(record: logging.LogRecord) -> dict[str, Any]:
    args = record.args
    return args if isinstance(args, dict) else {}


class _DropOurs(logging.Filter):
    """Drops one Celery line (``received`` or ``ignored``) per id noted above."""

    def __init__(self, kind: str, description: str | None) -> None:
        super().__init__()
        self.kind, self.description = kind, description

    def filter(self, record: logging.LogRecord) -> bool:
        context = _context(record)
        if "id" not in context:
            return True
        if self.description is not None and context.get("description") != self.description:
            return True
        return not _take(self.kind, context["id"])


def install() -> None:
    """Attach the filters once (idempotent; called when the task module is imported)."""
    for name, kind, description in (
        ("celery.worker.strategy", "received", None),
        ("celery.app.trace", "ignored", "ignored"),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropOurs) for f in logger.filters):
            logger.addFilter(_DropOurs(kind, description))
