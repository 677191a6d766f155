"""The rate guard: a run of a rate-limited task starts only when its limiter admits it.

When a run starts (``before_start``, after the singleton lock and the concurrency
permit, last: an admitted run starts at once, so the limit holds on the runs'
starts; a refused run gives its permit back as it parks) the guard asks the pool's
limiter for an admission -- through the pool's queue, so a run never passes runs
parked before it (one script call, ``park_take.lua``). Refused, the
run is **parked** in the queue (its whole message, ``retries`` unchanged, the current
message acknowledged, ``Ignore``; :func:`~..bounded.parking.park_message`) and a
worker's pump (:mod:`.pump`) publishes it again at its admission time by the server's
clock, charged as it is claimed: no ``retry()``, no re-publish per refused attempt, no
worker process or prefetch slot held while it waits. A fresh message is looked at in
the worker's main process already (:mod:`..bounded.intake`): admitted there (the
admission reserved for it) or parked there, before a pool process sees it.

A body that raises :class:`~celery_redislock.errors.RateLimited` (the API answered
429) penalizes the limiter for every worker (``retry_after`` seconds, else one
period of its first rate; ``rate_penalized`` is sent) and parks this run again,
behind the runs parked before it: not a retry (:func:`rate_limited_by_body`).

Every limited run sends ``rate_limited`` and logs one line, every admitted one
``rate_admitted`` (``parked``: admitted from the queue); a second message of a
parked run, skipped, sends ``rate_duplicate`` and logs one line. In eager mode the run
waits for its admission in place.

May import the core, the shared glue and the bounded feature's parking and intake.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

import redis
from celery.exceptions import Ignore

from ...core.parking import (
    DUPLICATE,
    REFUSED,
    START_MARGIN_US,
    ParkingQueue,
    RateCapacity,
    new_entry_id,
)
from ...errors import RateLimited, RedisLockError
from ..bounded.intake import Intake, NotAtIntake, register_intake
from ..bounded.journal import forget
from ..bounded.parking import (
    ATTEMPT,
    left_queue,
    park_attempt,
    park_message,
    park_state,
    register_park_header,
    reserved_at_intake,
    set_park_attempt,
)
from ..execution import AnyTask, Guard, Hold, RunState
from ..logs import quiet_ignored
from ..request_state import RequestSlot
from ..signals import rate_admitted, rate_duplicate, rate_limited, rate_penalized
from ..tokens import PARK_HEADER, RESENT_HEADER, running_owner
from .options import RateOptions, rate_options
from .pump import poke
from .queues import limiter_for, rate_queue, rate_spec

if TYPE_CHECKING:
    from celery.app.task import Context
    from celery.worker.request import Request

__all__ = [
    "RATE",
    "RATE_PARK_HEADER",
    "RateGuard",
    "RateHold",
    "limited",
    "rate_limited_by_body",
]

logger = logging.getLogger(__name__)

RATE_PARK_HEADER: Final = "redislock_rate_park"
"""Header of a run parked for its rate: ``"<park token> <retries> <first refusal>"``
(as the bounded feature's park header, for the rate queue)."""

# Not marked re-sent by this header: a run admitted at send carries it on its only
# publish (its "received" line is its one line); one published from the rate queue is
# marked by publish_claimed.


def _leave_rate_queue(task: AnyTask, token: str, again: bool) -> None:
    """A run the rate admitted (claimed from its queue) was refused a concurrency
    permit and parks for it: its claim is dropped and its charge refunded, so it is
    charged when it really starts -- it waited holding an admission nobody used,
    which held back every other run of the limiter meanwhile (#25).

    A token consumed already, on a first try (``again`` False), was taken by another
    message of the same parked run (published again after its claim lapsed), which
    runs: this one is skipped as the rate guard skips it -- parked or re-sent without
    its token, it was admitted afresh and the task ran twice. ``again``: this run's
    own earlier drop may have consumed it (its reply lost): it goes on."""
    request = task.request
    options = rate_options(task)
    pool = options.pool(task, request.args, request.kwargs)
    forget(task.app, token)  # before the token is consumed: see journal.py
    if rate_queue(task.app, pool, options.rates).drop(token) or again:
        return
    task_id = str(request.id)
    logger.warning(
        "celery_redislock: %s[%s] is a second message of a run parked for the rate of %r "
        "that started already: skipped",
        task.name,
        task_id,
        pool,
    )
    rate_duplicate.send(sender=task, task_id=task_id, key=pool)
    quiet_ignored(task_id)  # logged above: Celery's "ignored" line would repeat it
    raise Ignore()


# Its run parks under a fresh token when refused; one that parks for a permit
# leaves the rate queue.
register_park_header(RATE_PARK_HEADER, _leave_rate_queue)


class RateHold(Hold):
    """A run's admission: nothing to give back (the rate guard is the last one: no
    later guard parks an admitted run).

    Its take charged the limiter from the take plus ``START_MARGIN_US`` (10 ms), the
    time allowed for the rest of the run's hooks before its body: the limit holds on
    the bodies' starts as long as a body starts within it. A worker process
    descheduled longer between the take's reply and its body (a loaded machine) started
    its body after the charge, and N + 1 bodies could start within one period (#25:
    21-22 of N=20 in a 1 s window in 6 of 12 backlog benchmark runs at load 3-8). So
    when the body starts later than the margin after the take was sent (this
    process's monotonic clock: an upper bound of the time since the server's take),
    the take's charge moves to the server's now plus the margin
    (:meth:`~celery_redislock.core.parking.RateCapacity.charge_late`, one round
    trip, only then): no later admission comes within a period of its real start."""

    def __init__(
        self,
        task_id: str,
        pool: str,
        capacity: RateCapacity | None = None,
        taken: float | None = None,
        entry: tuple[str, str] = ("", ""),
    ) -> None:
        self.task_id, self.pool = task_id, pool
        self.capacity, self.taken = capacity, taken
        self.entry_id, self.owner = entry

    def on_start(self) -> None:
        """Move the run's charge to now if its body starts after its take's margin."""
        capacity, taken = self.capacity, self.taken
        if capacity is None or taken is None:
            return
        margin = START_MARGIN_US / 1_000_000
        try:
            # Again while the charge's own call took longer than the margin: the body
            # starts after its reply.
            for _ in range(_LATE_TRIES):
                if time.monotonic() - taken <= margin:
                    return
                logger.debug(
                    "celery_redislock: %s of %r starts %.1f ms after its take: its charge moves",
                    self.task_id,
                    self.pool,
                    (time.monotonic() - taken) * 1000,
                )
                taken = time.monotonic()
                capacity.charge_late(self.entry_id, self.owner)
        except (redis.RedisError, RedisLockError) as exc:
            # The run goes on: it was admitted and its admission charged once; only
            # the correction is missing. Not only an outage: an error Redis answers
            # (out of memory, read-only in a failover) failed an admitted run unrun.
            logger.warning(
                "celery_redislock: %s of %r started late and could not be charged again (%s: %s)",
                self.task_id,
                self.pool,
                type(exc).__name__,
                exc,
            )


_LATE_TRIES: Final = 3
"""Charge moves at most per run (each one's own call may come back late again)."""


class RateGuard(Guard):
    """Admits a run by its task's limiter, or parks it; see the module docs."""

    def enter(
        self, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Hold | None:
        """Admit the run, or park it and raise ``Ignore``."""
        options = rate_options(task)
        if not options.enabled:
            return None
        pool = options.pool(task, args, kwargs)
        request = task.request
        if request.is_eager:  # no queue to go back to: wait for the admission in place
            limiter_for(task.app, pool, options.rates).acquire()
            return RateHold(run.task_id, pool)
        queue = rate_queue(task.app, pool, options.rates)
        parked = park_state(request, RATE_PARK_HEADER)
        since = time.time() if parked is None else parked[1]
        if park_attempt(request) is not None:  # an earlier attempt may have parked it
            _park(task, run, queue, options, pool, since)
        if parked is not None:
            forget(task.app, parked[0])  # before the token is consumed: see journal.py
        entry = (new_entry_id() if parked is None else parked[0], _owner(request, run.task_id))
        status, _ = queue.take(*entry)
        if status == DUPLICATE and parked is not None and left_queue(request, RATE_PARK_HEADER):
            # This run tried to leave the rate queue (parking or re-sent for a permit)
            # and met an outage: its own drop consumed the token (the reply was lost),
            # so it is admitted afresh. Only after the take: a drop that never reached
            # Redis left the claim charged and claimed for this run -- admitted afresh
            # then, the claim lapsed, was published again and the task ran twice.
            parked = None
            entry = (new_entry_id(), entry[1])
            status, _ = queue.take(*entry)
        if status == DUPLICATE:
            logger.warning(
                "celery_redislock: %s[%s] is a second message of a run parked for the rate "
                "of %r that started already: skipped",
                task.name,
                run.task_id,
                pool,
            )
            rate_duplicate.send(sender=task, task_id=run.task_id, key=pool)
            quiet_ignored(run.task_id)  # logged above: Celery's "ignored" line would repeat it
            raise Ignore()
        if status == REFUSED:
            _park(task, run, queue, options, pool, since)
        # Published from the queue by its claim: a parked run's admission. A run whose
        # admission was reserved as it was sent or reached its worker carries a park
        # token too, but was admitted at once.
        was_parked = (
            parked is not None
            and RESENT_HEADER in (request.headers or {})
            and not reserved_at_intake(request, parked[0])
        )
        waited = max(0.0, time.time() - since) if was_parked else 0.0
        if was_parked:
            logger.debug(
                "celery_redislock: %s[%s] admitted by the rate of %r after %.3fs parked",
                task.name,
                run.task_id,
                pool,
                waited,
            )
        rate_admitted.send(
            sender=task,
            task_id=run.task_id,
            key=pool,
            rate=options.rates,
            parked=was_parked,
            waited=waited,
        )
        capacity = queue.capacity
        late = capacity if isinstance(capacity, RateCapacity) else None
        return RateHold(run.task_id, pool, late, queue.last_take_sent(), entry)


_OWNERS: Final[RequestSlot[str]] = RequestSlot("rate owner")
"""Beside a request: the owner its takes send (see :func:`_owner`)."""


def _owner(request: Context, task_id: str) -> str:
    """The owner this delivery's takes send: ``"<task id>@<nonce>"``
    (:func:`running_owner`), one per message run, kept beside its request for the guard's
    attempts after an outage. Never the bare task id: every message of a parked run
    carries its task id, and a take of a consumed token by the owner that consumed it
    is a re-sent take (its reply lost), answered as the first was -- so a second
    message of one park token was granted too and ran the task twice (#25: the lock
    Redis stopped mid-backlog; after its restart recovery parks every journaled run
    again, and a re-sent park publishes again the entries it claimed that are still
    claimed)."""
    owner = _OWNERS.get(request)
    if owner is None:
        owner = running_owner(task_id)
        _OWNERS.set(request, owner)
    return owner


RATE: Final = RateGuard()
"""The guard instance every ``RedisLockTask`` lists last in ``redislock_guards``."""


def _park(
    task: AnyTask, run: RunState, queue: ParkingQueue, options: RateOptions, pool: str, since: float
) -> None:
    """Park the run in ``queue`` (always raises ``Ignore``)."""
    position = park_message(
        task, run, queue, rate_spec(queue, options.rates), since, RATE_PARK_HEADER
    )
    limited(task, run.task_id, pool, options, position, max(0.0, time.time() - since))
    raise Ignore()


def limited(
    task: AnyTask, task_id: str, pool: str, options: RateOptions, position: int, waited: float
) -> None:
    """Say that a run was parked for the rate (its one log line and ``rate_limited``)."""
    logger.info(
        "celery_redislock: %s[%s] over the rate of %r (%s): parked at place %d",
        task.name,
        task_id,
        pool,
        ", ".join(options.rates),
        position,
    )
    rate_limited.send(
        sender=task,
        task_id=task_id,
        key=pool,
        rate=options.rates,
        position=position,
        waited=waited,
    )


def rate_limited_by_body(
    task: AnyTask, run: RunState, args: Any, kwargs: Any, exc: RateLimited
) -> BaseException:
    """The body raised ``exc``: penalize the limiter for every worker and park the run
    again (returns ``Ignore`` to raise); ``exc`` itself when the task is not rate
    limited (or it cannot be parked)."""
    options = rate_options(task)
    if not options.enabled or task.request.is_eager:
        return exc
    pool = options.pool(task, args, kwargs)
    limiter = limiter_for(task.app, pool, options.rates)
    seconds = exc.retry_after if exc.retry_after is not None else limiter.rates[0].period
    seconds = max(0.0, float(seconds))
    limiter.penalize(seconds)
    rate_penalized.send(
        sender=task, task_id=run.task_id, key=pool, rate=options.rates, seconds=seconds
    )
    logger.warning(
        "celery_redislock: %s[%s] was refused by its API (%s): the rate of %r is "
        "penalized for %.3fs and the run parked again",
        task.name,
        run.task_id,
        exc,
        pool,
        seconds,
    )
    set_park_attempt(task.request, new_entry_id())  # a new entry: its token was taken
    # Its admission was used: the parked message is charged again when it starts.
    run.holds[:] = [hold for hold in run.holds if not isinstance(hold, RateHold)]
    queue = rate_queue(task.app, pool, options.rates)
    since = time.time()
    try:
        position = park_message(
            task, run, queue, rate_spec(queue, options.rates), since, RATE_PARK_HEADER
        )
    except Exception as error:
        logger.error(
            "celery_redislock: %s[%s] could not be parked again after %s (%s: %s)",
            task.name,
            run.task_id,
            exc,
            type(error).__name__,
            error,
        )
        return exc
    limited(task, run.task_id, pool, options, position, 0.0)
    return Ignore()


def _rate_intake(task: AnyTask, request: Request) -> Intake | None:
    """A fresh run of a rate-limited task is admitted (reserved for it) or parked at
    intake; a message parked or admitted before goes to its pool process."""
    options = rate_options(task)
    if not options.enabled:
        return None
    message = request.request_dict
    if RATE_PARK_HEADER in message or PARK_HEADER in message:
        raise NotAtIntake("parked before: its run takes its entry")
    if ATTEMPT in message:  # its sender may have parked it: it parks again under that token
        raise NotAtIntake("a park at send without a reply")
    pool = options.pool(task, request.args, request.kwargs)
    queue = rate_queue(task.app, pool, options.rates)

    def parked(position: int) -> None:
        limited(task, request.id, pool, options, position, 0.0)
        poke(task.app)

    return Intake(queue, rate_spec(queue, options.rates), True, parked, RATE_PARK_HEADER)


register_intake(RATE, _rate_intake)
