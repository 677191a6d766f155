"""The concurrency guard: at most ``concurrency_limit`` runs of a pool at once.

Every run of a bounded task takes a **permit** of its pool's
:class:`~celery_redislock.core.RedisSemaphore` when it starts (``before_start``, after
the singleton lock when the task is a singleton too) and gives it back when it ends
(``__call__``'s ``finally``, before the result is stored). The permit is a lease of
``lock_ttl`` seconds renewed while the run lives, so a killed worker's permit comes
back within one ``lock_ttl``; the worker's main process gives it back at once when
Celery tells it the child died, hit its hard time limit or was terminated.

**Over the limit** a run never holds its worker slot for long:

1. with ``concurrency_wait`` > 0 (opt-in, default 0), if fewer than
   ``concurrency_waiters`` runs of the pool (default: its limit) wait in place
   already, across all workers, it waits in place too for up to that many seconds
   (woken the moment a permit is released);
2. otherwise, or if still refused, it is **parked** in the pool's queue in Redis
   (``concurrency_park``, the default; :mod:`.parking`) and the release that frees a
   permit publishes it again; with ``concurrency_park=False`` it publishes its own
   message again with a countdown of ``concurrency_countdown`` plus up to
   ``concurrency_jitter`` seconds (:mod:`.reschedule`). Either way the same task id,
   arguments, options and ``retries`` count (``max_retries`` is never spent), and it
   ends with ``Ignore``: the current message is acknowledged, no result is stored.

A singleton task hands its lock over to the parked or re-sent message, as to a
``retry()``. Meanwhile the task's ``AsyncResult`` reads ``PENDING`` (with
``task_track_started``, the ``STARTED`` the worker stored is set back to
``PENDING``); ``permit_parked`` or ``permit_rescheduled`` is sent.

In eager mode (``apply()``, ``task_always_eager``) there is no queue to go back to:
the run waits in place for a permit, as long as it takes.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Mapping
from typing import Any

from celery.app.task import Context

from ...core import Lease
from ...core.parking import DUPLICATE, ParkingSemaphore
from ...core.redelivery import mark_ran
from ..execution import AnyTask, Cleanup, Guard, Hold, RunState
from ..logs import LEASE, PERMIT
from ..options import options_of
from ..signals import (
    lease_lost,
    permit_acquired,
    permit_released,
)
from ..singleton.percall import run_lock_ttl
from ..tokens import NONCE_HEADER, TOKEN_HEADER, running_owner
from .journal import forget
from .options import BoundedOptions
from .parking import PARK_HEADER, park_attempt, park_state, parking_for, reserved_at_intake
from .redelivery import second_message
from .reschedule import WAIT_HEADER
from .reschedule import park as _park
from .reschedule import reschedule as _reschedule
from .settings import taken_memory
from .standby import take_parked

__all__ = [
    "CONCURRENCY",
    "WAIT_HEADER",
    "ConcurrencyGuard",
    "PermitHold",
    "permit_owner",
    "semaphore_for",
]


def semaphore_for(
    task: AnyTask,
    pool: str,
    limit: int,
    ttl: float,
    prefix: str,
    acks: Mapping[str, Any],
    standby: int = 0,
) -> ParkingSemaphore:
    """The semaphore of ``pool`` on the app's Redis, enforcing ``limit`` (``acks``: the
    replica acknowledgement terms, ``SingletonOptions.replicas``): a
    :class:`~celery_redislock.core.parking.ParkingSemaphore`, so every release hands
    its permit to a parked run of the pool, whether this task parks or not; ``standby``
    parked runs are published ahead to wait in place for the next permit."""
    return parking_for(task.app, pool, limit, ttl, prefix, acks, standby)


def permit_owner(task_id: str, seed: str | None) -> str:
    """The owner id of the permit a run of ``task_id`` takes: ``"<task id>@<12 hex>"``.

    Derived from the message's token or nonce header (``seed``), so the worker's main
    process, which never sees the child's lease, can release exactly that run's
    permit (:meth:`RedisSemaphore.release_owner`), and never another delivery's: each
    delivery has a seed of its own. Random when there is no seed (eager runs).
    """
    if not seed:
        return running_owner(task_id)
    return f"{task_id}@{hashlib.sha256(f'{seed}:permit'.encode()).hexdigest()[:12]}"


def _seed(headers: Mapping[str, object] | None) -> str | None:
    if not headers:
        return None
    seed = headers.get(TOKEN_HEADER) or headers.get(NONCE_HEADER)
    return seed if isinstance(seed, str) and seed else None


def _wait_state(request: Context) -> tuple[float | None, int]:
    """(first refusal in epoch seconds, re-schedules so far) from the wait header."""
    raw = (request.headers or {}).get(WAIT_HEADER)
    try:
        since, count, retries = str(raw).split()
        if int(retries) == (request.retries or 0):
            return float(since), int(count)
    except (TypeError, ValueError):
        pass
    return None, 0  # no header, or one a retry() copied from an earlier attempt


def _report_lost(task: AnyTask, task_id: str, pool: str, lease: Lease) -> None:
    if lease.released:  # found by its own release: the run ended (or its give-back, later)
        LEASE.error(
            "celery_redislock: task %s[%s] found its permit of pool %r no longer held when "
            "giving it back (%s)",
            task.name,
            task_id,
            pool,
            lease.lost_reason,
        )
    else:
        # Runs on the renewal thread. The body goes on (Celery cannot stop it safely);
        # the pool may now run one more than its limit until this run ends.
        LEASE.error(
            "celery_redislock: task %s[%s] lost its permit of pool %r while running (%s); "
            "the pool may run one more than its limit",
            task.name,
            task_id,
            pool,
            lease.lost_reason,
        )
    lease_lost.send(sender=task, task_id=task_id, key=pool, fence=lease.fence, kind="permit")


class PermitHold(Hold):
    """The permit of one run; given back when the run ends.

    On ``retry()`` it is kept to the end of this attempt, like any other ending: the
    next attempt takes a permit of its own when it starts.
    """

    def __init__(
        self,
        task: AnyTask,
        task_id: str,
        pool: str,
        lease: Lease,
        ran: tuple[ParkingSemaphore, str, float] | None = None,
    ) -> None:
        self.task, self.task_id, self.pool, self.lease = task, task_id, pool, lease
        self.ran = ran  # a parked run's (semaphore, park token, memory): see finish

    def finish(self, reason: str) -> bool:
        """Give the permit back (owner-checked: a lost one is reported, not released);
        False when it was no longer held.

        A parked run first marks its entry as run (#24): a further message of it (a
        broker's redelivery, a re-publish) is then dropped, not taken for the copy of
        a run that died."""
        if self.ran is not None:
            sem, entry_id, memory = self.ran
            try:
                mark_ran(sem, entry_id, memory)
            except Exception as exc:  # the release below still frees the permit
                LEASE.warning(
                    "celery_redislock: %s[%s] could not mark its parked run of pool %r "
                    "as ended (%s: %s); a redelivered copy may run again",
                    self.task.name,
                    self.task_id,
                    self.pool,
                    type(exc).__name__,
                    exc,
                )
        released = self.lease.release()
        permit_released.send(
            sender=self.task,
            task_id=self.task_id,
            key=self.pool,
            reason=reason,
            released=released,
            stage="run",
        )
        return released

    def __repr__(self) -> str:
        return f"<PermitHold {self.pool!r} of {self.task_id}>"


class ConcurrencyGuard(Guard):
    """Takes a permit of the task's pool when a run starts; see the module docs."""

    def enter(
        self, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Hold | None:
        """Take a permit, or wait for one (``concurrency_wait``, eager runs), or
        re-schedule the run and raise ``Ignore``."""
        resolved = options_of(task)
        options = resolved.bounded
        if not options.enabled:
            return None
        pool = options.pool(task, args, kwargs)
        limit = options.limit_of(pool)
        lock = resolved.singleton  # the permit's lease: lock_ttl, under the prefix
        standby = _standby(options)
        sem = semaphore_for(task, pool, limit, lock.lock_ttl, lock.prefix, lock.replicas, standby)
        request = task.request
        eager = bool(request.is_eager)
        owner = permit_owner(run.task_id, None if eager else _seed(request.headers))
        on_lost = functools.partial(_report_lost, task, run.task_id, pool)
        parked = None if eager else park_state(request)
        since, rescheduled = _wait_state(request) if parked is None else (parked[1], 0)
        tried_at, started = time.time(), time.monotonic()
        ttl = run_lock_ttl(request.headers, lock.lock_ttl)  # per call, else the task's
        lease: Lease | None = None
        if park_attempt(request) is not None:  # an earlier attempt may have parked it
            _park(task, run, sem, tried_at if since is None else since, limit)
        if parked is not None:  # published by the release that reserved its permit
            # A standby (no permit reserved) waits in place first; refused, it parks again.
            status, lease = take_parked(
                task.app,
                sem,
                parked[0],
                owner,
                standby=standby,
                wait=lock.lock_ttl,
                ttl=ttl,
                on_lost=on_lost,
                memory=taken_memory(task.app),
            )
            if status == DUPLICATE:  # alive, ended, or dead: Redis says (#24)
                lease = second_message(
                    task,
                    run,
                    sem,
                    parked[0],
                    owner,
                    ttl=ttl,
                    on_lost=on_lost,
                )
        elif eager:  # no queue to go back to: wait as long as it takes
            lease = sem.acquire(owner=owner, ttl=ttl, renew=True, on_lost=on_lost)
        else:
            lease = sem.acquire(blocking=False, owner=owner, ttl=ttl, renew=True, on_lost=on_lost)
            if lease is None and options.wait > 0 and _may_wait(sem, options, limit):
                lease = sem.acquire(
                    timeout=options.wait, owner=owner, ttl=ttl, renew=True, on_lost=on_lost
                )
        if lease is None:
            first = tried_at if since is None else since
            if options.park:
                _park(task, run, sem, first, limit)
            _reschedule(task, run, pool, limit, options, first, rescheduled)
        assert lease is not None
        # A permit its intake reserved for a fresh run was granted at once, not handed
        # off to a parked run (its entry is still marked as run when it ends: see ran).
        handed_off = parked is not None and not reserved_at_intake(request, parked[0])
        if parked is not None and not handed_off:
            waited = 0.0
        elif since is None:
            waited = time.monotonic() - started
        else:
            waited = max(0.0, time.time() - since)
        if handed_off:
            PERMIT.debug(
                "celery_redislock: %s[%s] took its permit of pool %r after %.3fs parked",
                task.name,
                run.task_id,
                pool,
                waited,
            )
        permit_acquired.send(
            sender=task,
            task_id=run.task_id,
            key=pool,
            limit=limit,
            fence=lease.fence,
            waited=waited,
            rescheduled=rescheduled,
            parked=handed_off,
        )
        ran = None if parked is None else (sem, parked[0], taken_memory(task.app))
        return PermitHold(task, run.task_id, pool, lease, ran)

    def cleanup(self, task: AnyTask, event: Cleanup) -> None:
        """Give back, from the worker's main process, the permit of a run that died
        (killed child, hard time limit, terminated). A run revoked before it started
        held none."""
        if not event.started:
            _drop_parked(task, event)
            return
        resolved = options_of(task)
        options = resolved.bounded
        if not options.enabled:
            return
        if callable(options.key) and event.args is None and event.kwargs is None:
            return  # its pool is unknown here: the permit expires after lock_ttl
        pool = options.pool(task, event.args, event.kwargs)
        lock = resolved.singleton
        sem = semaphore_for(
            task,
            pool,
            options.limit_of(pool),
            lock.lock_ttl,
            lock.prefix,
            lock.replicas,
            _standby(options),
        )
        for headers in event.deliveries:
            seed = _seed(headers)
            if seed and sem.release_owner(permit_owner(event.task_id, seed)):
                LEASE.info(
                    "celery_redislock: released the permit of pool %r held by %s[%s] after %s",
                    pool,
                    task.name,
                    event.task_id,
                    event.event,
                )
                permit_released.send(
                    sender=task,
                    task_id=event.task_id,
                    key=pool,
                    reason=event.event,
                    released=True,
                    stage="cleanup",
                )


def _drop_parked(task: AnyTask, event: Cleanup) -> None:
    """A parked run revoked or expired before it started never takes the permit its
    release reserved for it: consume its park token (else the entry goes back to the
    queue when the reservation lapses, and is published and revoked again, round after
    round) and hand the permit on at once, not after ``lock_ttl``."""
    ids = [
        str(h[PARK_HEADER]).split()[0]
        for h in event.deliveries
        if str(h.get(PARK_HEADER) or "").strip()
    ]
    resolved = options_of(task)
    options = resolved.bounded
    if (
        not ids
        or not options.enabled
        or (callable(options.key) and event.args is None and event.kwargs is None)
    ):
        return  # its pool is unknown here: the reservation lapses after lock_ttl
    pool = options.pool(task, event.args, event.kwargs)
    lock = resolved.singleton
    sem = semaphore_for(
        task,
        pool,
        options.limit_of(pool),
        lock.lock_ttl,
        lock.prefix,
        lock.replicas,
        _standby(options),
    )
    for entry_id in ids:
        forget(task.app, entry_id)
        status, lease = sem.take(entry_id, permit_owner(event.task_id, entry_id), renew=False)
        if lease is not None:
            lease.release()  # to the next parked run
        if status != DUPLICATE:
            PERMIT.info(
                "celery_redislock: parked run %s[%s] of pool %r was %s before it "
                "started: dropped from the parked queue, its permit handed on",
                task.name,
                event.task_id,
                pool,
                event.event,
            )


def _standby(options: BoundedOptions) -> int:
    """Parked runs to publish ahead on a release: by every release of the pool's
    permits, the main process's clean-up too (else the permit it frees goes to the
    standby waiting and nothing takes the standby's place until a run's release)."""
    return options.standby if options.park else 0


def _may_wait(sem: ParkingSemaphore, options: BoundedOptions, limit: int) -> bool:
    """True when fewer than ``concurrency_waiters`` runs already wait for the pool.

    A soft bound (two runs may look at once), but it keeps waiting in place from
    tying up more than about that many worker slots, whatever the backlog.
    """
    waiters = options.waiters_of(limit)
    return waiters > 0 and int(sem.client.zcard(sem.keys.queue)) < waiters


CONCURRENCY = ConcurrencyGuard()
"""The guard instance every ``RedisLockTask`` lists second in ``redislock_guards``."""
