"""Parking at intake: a run that would be refused capacity is parked by the worker's
main process, before a pool process ever sees its message.

A fresh message is looked at once, when Celery first asks the request whether it was
revoked -- in the main process, just before it would be sent to a pool process. Each
guard of the task says what intake may do for it (:func:`register_intake`): nothing
to do (the guard is off for the task), "not here" (:class:`NotAtIntake`: the run
decides in its pool process -- a singleton, ``concurrency_wait``), or the queue the run
would park in (:class:`Intake`: a bounded task with ``concurrency_park`` on, whatever
kind of capacity its queue waits for). For the first such queue in guard order (a
concurrency limit before a rate limit: the later one is decided in the pool process,
with the permit held), one script call (``park.lua`` in intake mode) parks it there
if the queue holds parked runs already (FIFO: it goes behind them) or no capacity is
free. A parked message is acknowledged
there and the request ends as a revoked one does, silently: no pool process, no pipe
round trip, no trace, no result write, no Celery "ignored" line. Otherwise the same
call reserves the free permit for the run (``hand_over``): its message is
acknowledged and carries the park token to the pool process, whose ``before_start``
takes the permit as a released parked run does -- so runs take permits in the order
their intake reached Redis, not in the order pool processes get to ``before_start``
(a run sent first was overtaken there and waited a whole extra run). With
``acks_late`` or standbys the run goes on unreserved instead, takes a permit in
``before_start`` and parks there if another run took it meanwhile.

Anything unexpected (Redis unreachable, a ``concurrency_key`` that raises) falls back to
that normal path. The park call is the main process's: it waits at most
:data:`INTAKE_BUDGET` for its reply, and after one that timed out intake rests for
:data:`INTAKE_REST` (a lock Redis that stopped answering would otherwise hold every
message of the worker behind each bounded one for the client's socket timeout). The
park token is handed on in the request (:data:`.parking` keeps it as an attempt), so
a park whose reply was lost is re-sent by the run under the same token and never
parks it twice.

**Redelivery.** The park token is not random: it is derived from what a redelivered
copy of the message carries unchanged (:func:`intake_token`) -- the task id, the
``retries`` count and the sending time ``apply_async`` stamps (:data:`SENT_HEADER`,
µs). A main killed between the park's reply and the message's ack leaves the message
unacknowledged; the broker hands it out again (kombu's Redis transport restores it
after ``visibility_timeout``, AMQP at once, flagged ``redelivered``), and its park is
then a re-sent park of a token Redis knows: nothing is parked again, the copy is
acknowledged and dropped (its run is parked, published, or has run). A retry
(``retries`` + 1) and a second ``apply_async(task_id=same)`` (its own sending time)
are new runs. A message without the header (a producer other than this package's
``apply_async``: ``send_task`` from another app) falls back to a digest of its body:
two such sends of one task id with the same arguments and options within the token
memory (:data:`~celery_redislock.core.parking.TAKEN_MEMORY_MS`) are taken for one
message, and run once.

May import the bounded feature's modules and the shared glue.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from celery import Celery
from celery.signals import worker_init
from celery.worker import state as worker_state
from celery.worker.request import Request
from celery.worker.state import reserved_requests, task_ready
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...core.parking import HANDED_OVER, NOT_PARKED, ParkingQueue
from ...core.scripts import reply_deadline
from ..execution import AnyTask, Guard
from ..logs import QuietRequest
from ..options import options_of
from ..signals import permit_parked
from ..singleton.guard import SINGLETON
from ..tokens import KEY_HEADER, TOKEN_HEADER, park_token
from . import handover
from .guard import CONCURRENCY, semaphore_for
from .journal import ParkSpec, forget, forget_if_taken, record
from .parking import (
    ATTEMPT,
    PARK_HEADER,
    RESERVED,
    SENT_HEADER,
    encode_request,
    park_header,
    semaphore_spec,
    sent_at,
    sent_token,
)

if TYPE_CHECKING:
    from celery.worker import WorkController

__all__ = [
    "INTAKE_BUDGET",
    "INTAKE_REST",
    "BoundedRequest",
    "Intake",
    "IntakeRule",
    "NotAtIntake",
    "connect",
    "intake_token",
    "park_at_intake",
    "register_intake",
]

INTAKE_BUDGET = 1.0
"""Seconds the worker's main process waits for an intake park's reply."""
INTAKE_REST = 5.0
"""Seconds an app's intake is skipped after a park call timed out (its runs park in
their pool process, as before)."""

_resting: weakref.WeakKeyDictionary[Celery, float] = weakref.WeakKeyDictionary()  # app -> until
_workers: weakref.WeakKeyDictionary[Celery, weakref.ref[WorkController]] = (
    weakref.WeakKeyDictionary()
)  # app -> its worker

logger = logging.getLogger("celery_redislock.celery.bounded.parking")


@dataclass(frozen=True)
class Intake:
    """Where a guard would park a fresh message at intake: its ``queue`` (named by
    ``spec``); ``hand_over``: free capacity may be reserved for this very run (a
    permit; see :meth:`~celery_redislock.core.parking.ParkingQueue.park`) rather than
    left to the run to take; ``parked(position)`` says the run was parked (its DEBUG
    line and signal); ``header``: the message header of its park token (the bounded
    queue's, or the guard's own)."""

    queue: ParkingQueue
    spec: ParkSpec
    hand_over: bool
    parked: Callable[[int], None]
    header: str = PARK_HEADER


class NotAtIntake(Exception):
    """Raised by an intake rule: this run's guard decides in its pool process."""


IntakeRule = Callable[[AnyTask, Request], Intake | None]
"""A guard's rule for a fresh request of a task: None when the guard is off for the
task, an :class:`Intake`, or :class:`NotAtIntake` raised."""

_rules: dict[Guard, IntakeRule] = {}


def register_intake(guard: Guard, rule: IntakeRule) -> None:
    """Let intake look at the runs of tasks guarded by ``guard`` (a task with a guard
    no rule was registered for is never looked at)."""
    _rules[guard] = rule


class BoundedRequest(QuietRequest):
    """The worker's request of a ``RedisLockTask``: a bounded run that would be refused
    a permit is parked from the main process (see the module docs)."""

    _redislock_looked = False

    def revoked(self) -> bool:
        """Celery's check, first; then, once, parking at intake (a parked request
        answers True: Celery then drops it without running it)."""
        if super().revoked():
            return True
        if self._redislock_looked or _not_due(self.eta):  # the timer holds it till then
            return False
        self._redislock_looked = True
        return park_at_intake(self)

    def on_accepted(self, pid: str, time_accepted: float) -> None:
        """A pool process accepted the run: a hand-over of its is no longer the
        main process's to give back at shutdown (:mod:`.handover`)."""
        handover.accepted(self)
        super().on_accepted(pid, time_accepted)


def park_at_intake(request: Request) -> bool:
    """Park ``request`` (a worker's request, in the main process) if its run would be
    refused capacity; True when it was parked and acknowledged."""
    task = request.task
    message = request.request_dict
    guards = getattr(task, "redislock_guards", ())
    if (
        not guards
        or PARK_HEADER in message
        or TOKEN_HEADER in message
        or KEY_HEADER in message
        or _not_due(request.eta)  # called directly
        or time.monotonic() < _resting.get(task.app, 0.0)
    ):
        return False
    try:
        intake = _intake_of(task, request, guards)
        if intake is None:
            return False
        since = time.time()
        entry_id = intake_token(request)
        payload = encode_request(task, request, entry_id, since, intake.header)
    except Exception as exc:
        logger.debug(
            "celery_redislock: %s[%s] not looked at on intake (%s: %s)",
            task.name,
            request.id,
            type(exc).__name__,
            exc,
        )
        return False
    queue = intake.queue
    # From here the park may have gone through: the run re-sends it under this token.
    message[ATTEMPT] = entry_id
    # Handed over (capacity is free): acknowledged here, its entry the run's only copy
    # (as a published parked run's), so acks_late keeps the path of before.
    hand_over = (
        intake.hand_over
        and not task.acks_late
        and not _shutting_down()
        and _a_process_is_free(task.app)
    )
    try:
        # Journaled first: it survives the lock Redis.
        record(task.app, entry_id, payload, spec=intake.spec, owner=request.id)
        with reply_deadline(time.monotonic() + INTAKE_BUDGET):
            position = queue.park(
                entry_id,
                payload,
                owner=request.id,
                intake=True,
                sent=sent_at(message.get(SENT_HEADER)),
                hand_over=hand_over,
            )
    except Exception as exc:
        if isinstance(exc, RedisTimeoutError):  # DeadlinePassed too: it stopped answering
            _resting[task.app] = time.monotonic() + INTAKE_REST
        logger.debug(
            "celery_redislock: %s[%s] could not park on intake (%s: %s); its run tries again",
            task.name,
            request.id,
            type(exc).__name__,
            exc,
        )
        return False
    if position == NOT_PARKED:
        del message[ATTEMPT]
        forget(task.app, entry_id)  # journaled in case it parked: it did not
        return False
    if position == HANDED_OVER:  # the run starts now and takes its entry's capacity
        del message[ATTEMPT]
        message[intake.header] = park_header(entry_id, message.get("retries"), since)
        message[RESERVED] = entry_id  # granted at once: not a parked run's hand-off
        request.acknowledge()
        handover.handed_over(request, queue, entry_id)  # given back if never started
        return False
    request.acknowledge()
    task_ready(request)
    if position == 0 and forget_if_taken(task.app, queue, entry_id):
        logger.debug(
            "celery_redislock: %s[%s] delivered again after its run started: dropped on intake",
            task.name,
            request.id,
        )
        return True
    intake.parked(position)
    return True


def _intake_of(task: AnyTask, request: Request, guards: tuple[Guard, ...]) -> Intake | None:
    """The queue of the first of the task's guards that would park ``request`` at
    intake; None when there is none or a guard has no rule; NotAtIntake from a rule.

    With two (a concurrency limit and a global rate limit, in guard order), a run
    waits at intake for the first -- a permit, holding nothing else: no rate charge
    while it waits (#25) -- and its pool process decides the later one with the
    earlier one held: admitted, it starts; refused, it parks for it and its permit
    goes to the next run. Every rule is asked: one saying "not here" keeps the run
    from intake altogether."""
    found = None
    for guard in guards:
        rule = _rules.get(guard)
        if rule is None:
            return None
        intake = rule(task, request)
        if found is None:
            found = intake
    return found


def _singleton_intake(task: AnyTask, request: Request) -> Intake | None:
    """A singleton run takes its lock in its pool process first: not at intake."""
    if options_of(task).singleton.enabled:
        raise NotAtIntake("a singleton")
    return None


def _concurrency_intake(task: AnyTask, request: Request) -> Intake | None:
    """A bounded run parks at intake in its pool's queue (a permit free: reserved for
    it, unless standbys are kept), unless it may wait in place or re-publish."""
    resolved = options_of(task)
    options = resolved.bounded
    if not options.enabled:
        return None
    if not options.park or options.wait > 0:
        raise NotAtIntake("concurrency_park off, or concurrency_wait")
    lock = resolved.singleton
    pool = options.pool(task, request.args, request.kwargs)
    limit = options.limit_of(pool)
    sem = semaphore_for(
        task, pool, limit, lock.lock_ttl, lock.prefix, lock.replicas, options.standby
    )

    def parked(position: int) -> None:
        logger.debug(
            "celery_redislock: %s[%s] over the limit of pool %r (%d): parked at place %d on intake",
            task.name,
            request.id,
            pool,
            limit,
            position,
        )
        permit_parked.send(
            sender=task, task_id=request.id, key=pool, limit=limit, position=position, waited=0.0
        )

    return Intake(sem, semaphore_spec(sem, limit), not sem.standby, parked)


register_intake(SINGLETON, _singleton_intake)
register_intake(CONCURRENCY, _concurrency_intake)


def _a_process_is_free(app: Celery) -> bool:
    """False when this worker's requests waiting for or holding a pool process (this one
    included) outnumber its processes: a permit handed over would sit idle, reserved
    for a run queued behind busy processes, while other workers' runs stay parked."""
    ref = _workers.get(app)
    concurrency = getattr(ref() if ref is not None else None, "concurrency", None)
    if not isinstance(concurrency, int):  # not known (no worker_init seen): as before
        return True
    return len(reserved_requests) <= concurrency


def _shutting_down() -> bool:
    """True once this worker was told to shut down (Celery's own flags, which its
    signal handlers set): a message it still takes is never sent to a pool process
    (Celery drops the jobs not written to one yet and leaves their messages to the
    broker), so a permit handed over to it would sit reserved for ``lock_ttl`` with
    its message acknowledged -- the pool idled until the sweeper published the entry
    again. Not handed over, the message stays unacknowledged and the broker gives it
    to another worker, as plain Celery's."""
    flags = (worker_state.should_stop, worker_state.should_terminate)
    return any(flag is not None and flag is not False for flag in flags)


def _on_worker_init(sender: WorkController | None = None, **_: object) -> None:
    app = getattr(sender, "app", None)
    if sender is not None and app is not None:
        _workers[app] = weakref.ref(sender)


def connect() -> None:
    """Know each worker's process count (its main process; idempotent): see
    :func:`_a_process_is_free`."""
    worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_redislock.intake.worker_init"
    )
    handover.connect()  # hand-overs a worker shutting down never started


def intake_token(request: Request) -> str:
    """The park token of ``request``'s intake park: the same for every delivery of one
    message, different for every publish (see the module docs, *Redelivery*)."""
    message = request.request_dict
    sent = message.get(SENT_HEADER)
    if sent is not None:
        return sent_token(request.id, message.get("retries"), sent)
    # Not sent by our apply_async: what a redelivery keeps is the body.
    body = request.body
    raw = body if isinstance(body, bytes) else repr(body).encode()
    identity = b"body " + hashlib.sha256(raw).digest()
    return park_token(str(request.id), int(message.get("retries") or 0), identity)


def _not_due(eta: datetime | None) -> bool:
    """True for a message whose ETA is still ahead (the timer holds it until then)."""
    if eta is None:
        return False
    now = datetime.now(timezone.utc) if eta.tzinfo is not None else datetime.now()
    return eta > now
