"""What a run of a ``RedisLockTask`` holds, and the seam for adding more: guards.

A **guard** is one kind of resource a run needs: the singleton lock today, a
concurrency permit next (see :class:`Guard`). ``before_start`` asks each guard of the
task, in order, to :meth:`Guard.enter`; a guard grants a :class:`Hold` or refuses by
raising (``Ignore`` to skip the run, ``Retry``...). Every hold is given back in
reverse order when the run ends -- in ``__call__``'s ``finally``, before Celery stores
the result, so a client that saw the result can enqueue the job again at once -- or by
the ``task_postrun`` safety net, or, when the child died, by :meth:`Guard.cleanup` in
the worker's main process. On ``retry()`` each hold decides whether the next attempt
inherits it (:meth:`Hold.on_retry`).

The run's state is kept beside its Celery request (:mod:`.request_state`), so thread
pools and nested ``apply()`` calls each see their own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from .giveback import OUTAGE_ERRORS, give_back_later
from .request_state import RequestSlot
from .tokens import HEADERS, RESENT_HEADER

if TYPE_CHECKING:
    from celery.worker.request import Request

__all__ = [
    "AnyTask",
    "Cleanup",
    "Guard",
    "Hold",
    "RunState",
    "current_run",
    "outcome_of",
    "resend",
    "start_run",
]

AnyTask = Task[Any, Any]
"""Any Celery task, whatever its parameters and result."""

logger = logging.getLogger(__name__)


class Hold:
    """Something a run holds until it ends (a lease, a permit)."""

    def finish(self, reason: str) -> bool:
        """Give it back at the end of the run; ``reason`` is the outcome ("SUCCESS"...).
        False when it was no longer held (lost: the hold's lease reports it); True when
        given back, or nothing was left to give back."""
        return True

    def __repr__(self) -> str:
        # A log line ("could not give back <...>") must say what it is.
        task_id = getattr(self, "task_id", None)
        return f"<{type(self).__name__} of {task_id}>" if task_id else f"<{type(self).__name__}>"

    def on_start(self) -> None:
        """The body is about to be called (every guard entered, Celery's hooks run):
        the last moment before the run really starts. Default: nothing."""

    def on_retry(self, key: str | None, delay: float, headers: dict[str, Any]) -> None:
        """``retry()`` is about to publish the next attempt (same task id), which will
        start after ``delay`` seconds and whose singleton key is ``key`` (None: not a
        singleton task). Put what the next attempt inherits in ``headers``. Default:
        nothing; the hold is given back when the run ends."""

    def on_retry_published(self) -> None:
        """The next attempt was published: forget what was handed over."""

    def on_retry_failed(self) -> None:
        """Publishing the next attempt failed: take back (or give back) what was prepared."""

    def on_park(self, headers: dict[str, Any]) -> None:
        """The run is about to be parked (see :mod:`.parking`): put what the parked
        message inherits in ``headers``, keeping it held until :meth:`on_parked`."""

    def on_parked(self) -> None:
        """The run was parked: hand over what :meth:`on_park` put in the headers."""

    def on_park_failed(self) -> None:
        """Parking failed: keep holding what :meth:`on_park` prepared."""


class Guard:
    """One kind of resource the runs of a task need; see the module docs.

    Subclasses override what they need; the defaults do nothing. Guards are shared by
    every task that lists them, so they keep no per-run state (that goes in the hold).
    """

    def enter(
        self, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Hold | None:
        """Take the resource for a run that starts (in the worker's child, in
        ``before_start``); None when this task does not use the guard. May raise
        ``Ignore`` (skip the run) or any exception (the run fails)."""
        return None

    def received(self, task: AnyTask, request: Request) -> None:
        """A message of ``task`` reached the worker's main process (``task_received``)."""

    def cleanup(self, task: AnyTask, event: Cleanup) -> None:
        """The run cannot clean up after itself: give back, from the worker's main
        process, what it held (see :class:`Cleanup`)."""


@dataclass(frozen=True)
class Cleanup:
    """A run that ended (or never started) where its own code could not clean up.

    ``event``: ``"revoked"`` (revoked or expired before it started), ``"terminated"``
    (``revoke(terminate=True)``), ``"worker-lost"`` (the child died) or
    ``"time-limit"`` (hard time limit; the child was killed). ``deliveries`` holds the
    ``redislock_*`` headers of each delivery of the task id this worker received
    (usually one); ``args``/``kwargs`` are None when unknown.
    """

    task_id: str
    event: str
    deliveries: tuple[dict[str, str], ...]
    args: Any = None
    kwargs: Any = None

    @property
    def started(self) -> bool:
        """True when the run had started (its execution lease may be live)."""
        return self.event != "revoked"


@dataclass
class RunState:
    """One run of a task: the holds its guards granted, in order."""

    task: AnyTask
    task_id: str
    holds: list[Hold] = field(default_factory=list)
    entered: bool = False
    finished: bool = False

    def finish(self, reason: str) -> None:
        """Give every hold back, last first (once). Never raises: a failed release is
        logged; one that failed because Redis was unreachable is tried again when it
        answers (:mod:`.giveback`), any other lease simply expires."""
        if self.finished:
            return
        self.finished = True
        for hold in reversed(self.holds):
            try:
                hold.finish(reason)
            except OUTAGE_ERRORS as exc:  # Redis unreachable: again once it answers (#29)
                logger.error(
                    "celery_redislock: could not give back %r of %s[%s] (%s); giving it "
                    "back when the lock Redis answers again, else it expires by itself",
                    hold,
                    self.task.name,
                    self.task_id,
                    exc,
                )
                give_back_later(hold, reason, self.task.name, self.task_id)
            except Exception:
                logger.exception(
                    "celery_redislock: could not give back %r of %s[%s]; it expires by itself",
                    hold,
                    self.task.name,
                    self.task_id,
                )


_RUNS: Final[RequestSlot[RunState]] = RequestSlot("run")


def start_run(task: AnyTask, task_id: str) -> RunState:
    """Start a new :class:`RunState` beside the task's current request and return it."""
    run = RunState(task, task_id)
    _RUNS.set(task.request, run)
    return run


def current_run(task: AnyTask) -> RunState | None:
    """The run of ``task`` executing in this thread (its current request), or None."""
    return _RUNS.get(task.request_stack.top)


def outcome_of(exc: BaseException | None) -> str:
    """The Celery state name an exception ending a run stands for."""
    if exc is None:
        return "SUCCESS"
    if isinstance(exc, Retry):
        return "RETRY"
    if isinstance(exc, Ignore):
        return "IGNORED"
    if isinstance(exc, Reject):
        return "REJECTED"
    return "FAILURE"


def resend(task: AnyTask, countdown: float, extra_headers: dict[str, str]) -> None:
    """Publish the current request of ``task`` again, ``countdown`` seconds from now.

    Same task id, arguments, canvas options and retry count (it is not a retry, so it
    does not spend ``max_retries``); our headers are dropped (the copy takes its locks
    afresh) and ``extra_headers`` added. For a run that must wait for a resource:
    call it, then raise ``Ignore``.
    """
    sig = task.signature_from_request(task.request, countdown=countdown)
    options = dict(sig.options)
    headers = {k: v for k, v in (options.get("headers") or {}).items() if k not in HEADERS}
    # Marked re-sent: its "received" line is not logged again (see .logs).
    options["headers"] = {**headers, RESENT_HEADER: "1", **extra_headers}
    # Task.apply_async, not ours: the copy must be published although the lock is held,
    # and it is not a retry, so max_retries is not spent. Not a child of this run: a
    # kept AsyncResult keeps Celery's result subscription (see bounded/reschedule.py).
    Task.apply_async(task, sig.args, sig.kwargs, add_to_parent=False, **options)
