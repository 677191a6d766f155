"""``RedisLockTask``, the one Task base class, and ``SingletonTask``.

Where each part runs (celery 5.7):

* ``apply_async`` (the producer) takes the singleton lock for the queue and puts its
  token in the message (:mod:`.singleton.enqueue`);
* ``before_start`` (the worker, in the same ``try`` as the body, so ``Ignore`` or an
  error there is the task's outcome) enters the task's guards (:mod:`.execution`,
  :mod:`.singleton.guard`, then :mod:`.bounded.guard`);
* ``__call__`` runs the body and gives every hold back in its ``finally``, before the
  tracer stores the result (``task_postrun`` is a safety net, :mod:`.cleanup`);
* the worker's main process cleans up after revoke, time limit and lost children.

A **direct call** ``task(...)`` runs the body only: no hook runs, no lock is taken or
checked. ``apply()`` and ``task_always_eager`` go through the same path as a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, ParamSpec, TypeVar

from celery import Celery, Task
from celery.canvas import Signature
from celery.result import AsyncResult
from kombu import Producer

from ..errors import RateLimited
from . import cleanup, logs, outage, upstream
from .bounded import buckets, intake, sweeper
from .bounded.guard import CONCURRENCY
from .bounded.options import PoolKey
from .execution import Guard, current_run, outcome_of, start_run
from .literals import OnDuplicate, OnRunningDuplicate, SingletonMode
from .options import check_class_options
from .outage import OUTAGE_ERRORS, client_error, enter_guard
from .ratelimit import enqueue as rate_enqueue
from .ratelimit import pump
from .ratelimit.guard import RATE, rate_limited_by_body
from .ratelimit.options import check_rate_options
from .redlock import check_not_bounded
from .request_state import inherit
from .singleton import enqueue, lookup
from .singleton.guard import SINGLETON
from .singleton.percall import NO_CALL_OPTIONS, call_options, check_unknown_options

__all__ = ["RedisLockTask", "SingletonTask"]

_P = ParamSpec("_P")
_R = TypeVar("_R", covariant=True)


class RedisLockTask(Task[_P, _R]):
    """Celery task base class with singleton locks and bounded concurrency.

    Every feature is an option: a class attribute, settable with
    ``@app.task(base=RedisLockTask, option=...)``, by subclassing, or through
    ``task_annotations``. ``None`` means "the app's ``redislock_*`` setting". See
    :mod:`celery_redislock.celery.singleton.options` for the full table.

    Subclasses that override ``apply_async``, ``before_start`` or ``__call__`` must
    call ``super()``. To add a resource every run must hold, append a
    :class:`~.execution.Guard` to :attr:`redislock_guards`.
    """

    singleton: bool = False
    """Take a per-signature lock, so the same job is neither queued nor run twice."""

    unique_on: Sequence[str] | str | None = None
    """Argument names that make the signature (default: all arguments)."""

    lock_key: Callable[..., str] | None = None
    """Callable ``key(*args, **kwargs) -> str`` giving the whole lock key."""

    lock_ttl: float | None = None
    """Seconds: lease of a running task, renewed while it runs (``redislock_lock_ttl``)."""

    lock_queued_ttl: float | None = None
    """Seconds: lease of a queued task, plus its countdown/ETA (``redislock_queued_ttl``)."""

    on_duplicate: OnDuplicate | None = None
    """``"existing"``, ``"raise"``, ``"drop"`` or ``"replace"`` (``redislock_on_duplicate``)."""

    on_running_duplicate: OnRunningDuplicate = "skip"
    """A copy starting while another holds the lock: ``"skip"`` or ``"reschedule"``."""

    reschedule_countdown: float | None = None
    """Seconds before a rescheduled runtime duplicate runs again (default 5)."""

    singleton_mode: SingletonMode = "until_done"
    """``"until_done"``, ``"while_running"``, ``"until_started"``, ``"interval"`` or
    ``"until_and_while_executing"``."""

    singleton_interval: float | None = None
    """Seconds the lock stays held after a run ends (``singleton_mode="interval"``)."""

    concurrency_limit: int | None = None
    """At most this many runs of the task's pool at once, across all workers (None:
    not bounded); ``redislock_concurrency_limits`` may override it per pool."""

    concurrency_key: PoolKey = None
    """The pool: None (the task's name), a pool name shared by several tasks, or a
    callable ``key(*args, **kwargs) -> str`` of the task's arguments."""

    concurrency_countdown: float | None = None
    """Seconds before a re-scheduled run is tried again (``redislock_concurrency_countdown``,
    0.2)."""

    concurrency_jitter: float | None = None
    """Up to this many seconds more, at random (``redislock_concurrency_jitter``, 0.3)."""

    concurrency_wait: float | None = None
    """Seconds a refused run may wait in place before it is re-scheduled
    (``redislock_concurrency_wait``, 0.5; 0: never wait in place)."""

    concurrency_waiters: int | None = None
    """At most this many runs of a pool wait in place at once, across all workers
    (``redislock_concurrency_waiters``; None: as many as the limit)."""

    concurrency_standby: int | None = None
    """Opt-in: parked runs of the pool published ahead to wait in place for the next
    permit, handed over with no broker round trip (``redislock_concurrency_standby``,
    0)."""

    concurrency_park: bool | None = None
    """Park a refused run in the pool's FIFO queue in Redis, published again when a
    permit frees (``redislock_concurrency_park``, True); False: re-publish it with a
    countdown (polling)."""

    global_rate_limit: str | list[str] | None = None
    """At most this many runs per period across every worker, by the lock Redis's
    clock: ``"N/period"`` (``"10/s"``, ``"500/m"``, ``"5/10s"``) or a list of them, all
    of which must admit a run (None: no global rate limit). Over it a run is parked
    and started at its admission time (see :mod:`.ratelimit.guard`)."""

    global_rate_key: PoolKey = None
    """The limiter's name: None (the task's name), a string shared by several tasks,
    or a callable of the task's arguments (``key(*args, **kwargs) -> str``)."""

    Request = "celery_redislock.celery.bounded.intake:BoundedRequest"
    """The worker's request class: Celery's, noting copies this package re-sent so
    their receipt is not logged twice (see :mod:`.logs`), and parking a bounded run
    that would be refused a permit from the worker's main process (see
    :mod:`.bounded.intake`)."""

    redislock_guards: ClassVar[tuple[Guard, ...]] = (SINGLETON, CONCURRENCY, RATE)
    """What each run holds, entered in this order and given back in reverse: the
    singleton lock first, then the concurrency permit, then the rate's admission --
    last, so a run admitted starts at once (the limit holds on the runs' starts; a run
    refused parks for the rate and gives its permit back)."""

    @classmethod
    def bind(cls, app: Celery) -> Celery:
        """Bind to ``app`` (Celery applies ``task_annotations`` here), then validate
        the options, so a bad one fails when the task is defined."""
        bound = super().bind(app)
        check_unknown_options(cls.name, dir(cls), dir(RedisLockTask))
        check_class_options(cls)
        check_rate_options(cls)
        check_not_bounded(app, cls.name, cls.concurrency_limit)
        return bound

    def apply_async(  # type: ignore[override]  # "drop" returns None
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Producer | None = None,
        link: Signature[Any] | list[Signature[Any]] | None = None,
        link_error: Signature[Any] | list[Signature[Any]] | None = None,
        shadow: str | None = None,
        *,
        on_duplicate: OnDuplicate | None = None,
        singleton: bool | None = None,
        lock_ttl: float | None = None,
        lock_queued_ttl: float | None = None,
        **options: Any,
    ) -> AsyncResult[_R] | None:
        """Send the task, taking its singleton lock first (see :mod:`.singleton.enqueue`).

        Returns the new task's ``AsyncResult``; for a duplicate, what
        ``on_duplicate`` says: the existing copy's ``AsyncResult`` (``"existing"``),
        ``DuplicateTask`` raised (``"raise"``), None (``"drop"``), or the new task's
        result after revoking a queued copy (``"replace"``).

        Per call: ``on_duplicate``, ``singleton=False`` (neither this call nor its run
        takes the singleton lock), ``lock_ttl`` (the run's lease: singleton lock and
        concurrency permit) and ``lock_queued_ttl`` override the task's options. Any
        other keyword that looks like ours (``lock_*``, ``singleton_*``,
        ``concurrency_*``, ``on_*duplicate*``, ``once``) raises ``ConfigurationError``.
        """
        call = call_options(self, options, on_duplicate, singleton, lock_ttl, lock_queued_ttl)
        if call is NO_CALL_OPTIONS and not (producer or link or link_error or shadow):
            # Over its global rate: parked now, published once at its admission time.
            parked, task_id, options = rate_enqueue.park_at_send(
                self, args, kwargs, task_id, options
            )
            if parked is not None:
                return parked
        published: list[bool] = []

        def publish(new_id: str, headers: dict[str, Any]) -> AsyncResult[_R]:
            published.append(True)  # from here on an error may be the broker's
            return super(RedisLockTask, self).apply_async(
                args,
                kwargs,
                new_id,
                producer,
                link,
                link_error,
                shadow,
                **{**options, "headers": headers},
            )

        try:
            return enqueue.apply_async(self, publish, args, kwargs, task_id, options, call)
        except OUTAGE_ERRORS as exc:
            if published:
                raise
            raise client_error(self.app, exc) from exc  # says it is the lock Redis (#29)

    def singleton_key(self, *args: _P.args, **kwargs: _P.kwargs) -> str:
        """The singleton lock name of a call with these arguments (what
        ``apply_async`` would lock; celery-singleton's ``generate_lock``). Read-only."""
        return lookup.singleton_key(self, args, kwargs)

    def singleton_holder(self, *args: _P.args, **kwargs: _P.kwargs) -> AsyncResult[_R] | None:
        """The ``AsyncResult`` of the copy, queued or running, that holds the lock of a
        call with these arguments, or None (celery-singleton's
        ``get_existing_task_id``). Read-only: takes nothing."""
        return lookup.singleton_holder(self, args, kwargs)

    def before_start(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Enter every guard: take the singleton lock (or skip as a duplicate), then a
        concurrency permit (or re-schedule the run)."""
        run = start_run(self, task_id)
        try:
            for guard in self.redislock_guards:
                hold = enter_guard(guard, self, run, args, kwargs)
                if hold is not None:
                    run.holds.append(hold)
        except BaseException as exc:
            run.finish(outcome_of(exc))
            raise
        super().before_start(task_id, args, kwargs)

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request made of the current one's attributes (``Task.__call__`` does,
        for a direct call): it sees the state of ours kept beside the current one too
        (:mod:`.request_state`)."""
        outer = self.request
        super().push_request(*args, **kwargs)
        inherit(outer, self.request)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Run the body; when run by a worker, give the holds back before the result
        is stored. A direct call runs the body alone, without any lock."""
        run = current_run(self)
        if run is None or run.entered:  # a direct call (maybe from inside the body)
            return super().__call__(*args, **kwargs)
        run.entered = True
        error: BaseException | None = None
        try:
            # In the try: an error of a hold's start fails the run as the body's would,
            # its holds given back here, before the result is stored (the task_postrun
            # safety net comes only after: a caller who saw the failure found them held).
            for hold in run.holds:
                hold.on_start()
            # The tracer pushed the request already: call run() as Celery's own fast
            # path does (celery/app/trace.py), not Task.__call__, which pushes again.
            return self.run(*args, **kwargs)
        except RateLimited as exc:  # a 429: penalize the limiter, park the run again
            error = rate_limited_by_body(self, run, args, kwargs, exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException as exc:
            error = exc
            raise
        finally:
            run.finish(outcome_of(error))


class SingletonTask(RedisLockTask[_P, _R]):
    """A :class:`RedisLockTask` with the per-signature lock on (``singleton = True``)."""

    singleton = True


cleanup.connect()
outage.connect()
sweeper.connect()
intake.connect()
pump.connect()
upstream.connect()
buckets.connect()  # Celery's rate_limit beside a pool (#29 item 1)
logs.install()
