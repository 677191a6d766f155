"""Blocking acquire: wait, queued, until a release grants the lease or a poll finds it.

A waiter listens on its process's subscriber (see :mod:`.notifier`). A release that
hands the lease straight to the waiter says ``<token> <fence>``: the wait ends with
no further round trip. A plain wake-up (``<token>``) makes it ask again. It never
relies on a message alone: it also polls, at most every ``max_poll`` seconds and
never later than the holder's TTL runs out, so a lost message costs latency, never
liveness (a poll finds a lease granted meanwhile, as a re-sent acquire does).

Every queued attempt inside :func:`wait_until_granted` follows a confirmed
subscription, so a release after it reaches the waiter. (A semaphore's first try
may queue before subscribing; the attempt made once subscribed catches any release
in between, and finds a lease granted meanwhile.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator
from typing import Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .notifier import WAKE_ALL, Notifier, Waiter
from .scripts import RedisClient, reply_deadline

__all__ = [
    "ATTEMPT",
    "MAX_POLL",
    "OUTAGE_ERRORS",
    "OUTAGE_GRACE",
    "WAITER_HEARTBEAT_MS",
    "WAKE_ALL",
    "Grant",
    "Heard",
    "Notifier",
    "WaitClock",
    "Waiter",
    "granted_lease",
    "poll_slice",
    "wait_until_granted",
]

ATTEMPT = -1.0
"""What :meth:`WaitClock.rounds` yields for an attempt (any other value: a sleep)."""


class Heard(Protocol):
    """What a waiter's wake-up messages told it (the sync and the async waiter)."""

    notified: bool
    """A message named it (or all) since it was last cleared."""
    fence: int
    """> 0 once a release granted it its lease."""


Grant = tuple[int, float]
"""A lease granted to a waiter: its fence, and a ``time.monotonic()`` no later than
the grant (the lease's local deadline counts from it)."""

MAX_POLL = 1.0
"""Longest sleep, in seconds, between two checks of a waiter: its heartbeat period."""

WAITER_HEARTBEAT_MS = 5000
"""A queued waiter that has not checked in for this long is dropped from the queue."""

LEAVE_GRACE = 0.1
"""Seconds past its deadline a waiter may spend leaving the queue (see ``_grace``)."""

OUTAGE_GRACE = 30.0
"""Seconds a waiter with no deadline keeps asking through connection errors (a
Sentinel failover takes a few seconds) before it raises the last one."""


OUTAGE_ERRORS = (RedisConnectionError, RedisTimeoutError)
"""Errors of an attempt that a waiter rides out (see :meth:`WaitClock.failed`); the
async client raises the same classes."""


def granted_lease(fence: int, sent_at: float, ms_left: int, ttl_ms: int) -> Grant:
    """The :data:`Grant` an attempt sent at ``sent_at`` answered with ``ms_left`` of a
    ``ttl_ms`` lease: less than ``ttl_ms`` left means a release granted it earlier,
    and the lease counts from then, not from this attempt."""
    return fence, sent_at + (ms_left - ttl_ms) / 1000.0


def poll_slice(ttl_ms: int) -> float:
    """Longest sleep between a waiter's requests for a lease of ``ttl_ms``: a grant by
    message counts from the last request (see :func:`wait_until_granted`), so a short
    lease needs requests close enough together to start with most of its TTL."""
    return min(MAX_POLL, ttl_ms / 3000.0)


class WaitClock:
    """The decisions of one queued wait, with no I/O: the sync driver
    (:func:`wait_until_granted`) and the async one (``celery_redislock.asyncio``) both
    follow them, so their waits cannot drift apart.

    Per round: :meth:`granted` (did a release grant the lease by message?), then
    :meth:`asking` right before an attempt is sent; after a refusal
    :meth:`sleep_after` says how long to wait for a message (None: the deadline
    passed, so leave the queue and end with :meth:`granted` of the fence the leave
    found); after a connection error :meth:`failed` says whether to give up.
    """

    __slots__ = ("deadline", "failing_since", "last_asked", "max_poll")

    def __init__(self, deadline: float | None, max_poll: float = MAX_POLL) -> None:
        self.deadline = deadline
        self.max_poll = max_poll
        self.last_asked = time.monotonic()
        self.failing_since: float | None = None

    def granted(self, fence: int) -> Grant | None:
        """The grant of a lease of ``fence`` that a release (or a leave) found, else
        None. Granted after our last (refused) request was sent: the lease's local
        deadline counts from then, so it never outlives the server's."""
        return (fence, self.last_asked) if fence else None

    def asking(self) -> None:
        """An attempt is about to be sent."""
        self.last_asked = time.monotonic()

    def answered(self) -> None:
        """An attempt got an answer: any outage is over."""
        self.failing_since = None

    def failed(self) -> bool:
        """An attempt failed with one of :data:`OUTAGE_ERRORS`: True to give up (raise
        it), when the next try would come after the deadline (or after
        :data:`OUTAGE_GRACE` seconds of errors without one); else ask again, treating
        the failure as a refusal of unknown length (``sleep_after(0)``)."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        limit = self.failing_since + OUTAGE_GRACE if self.deadline is None else self.deadline
        return now + self.max_poll >= limit

    def rounds(self, waiter: Heard) -> Generator[float, Grant | int | None, Grant | None]:
        """The wait's rounds, once for the sync driver and the async one: yields
        :data:`ATTEMPT` for an attempt (send its outcome: the :data:`Grant`, or the ms
        the holder has left; throw one of :data:`OUTAGE_ERRORS` into it), or the
        seconds to wait for a message naming ``waiter`` (send None). Returns the grant,
        or None once the deadline passed (the driver then leaves the queue)."""
        while True:
            waiter.notified = False
            grant = self.granted(waiter.fence)
            if grant is not None:
                return grant
            self.asking()
            try:
                outcome = yield ATTEMPT
                self.answered()
            except OUTAGE_ERRORS:
                if self.failed():
                    raise
                outcome = 0
            if isinstance(outcome, tuple):
                return outcome
            sleep = self.sleep_after(outcome or 0)
            if sleep is None:
                return None
            yield sleep

    def sleep_after(self, wait_ms: int) -> float | None:
        """Seconds to wait for a message after a refusal whose holder has ``wait_ms``
        left (0: unknown): until that TTL, ``max_poll`` or the deadline, whichever
        comes first; None once the deadline passed."""
        max_poll = self.max_poll
        sleep = max_poll if wait_ms <= 0 else min(max_poll, wait_ms / 1000.0 + 0.001)
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                return None
            sleep = min(sleep, left)
        return sleep


def wait_until_granted(
    client: RedisClient,
    channel: str,
    token: str,
    attempt: Callable[[], Grant | int],
    leave: Callable[[], int],
    release: Callable[[], object],
    deadline: float | None,
    max_poll: float = MAX_POLL,
) -> Grant | None:
    """Wait, queued as ``token``, until a lease is granted or ``deadline`` passes.

    ``attempt()`` tries once, queued, and returns the :data:`Grant`, else the
    milliseconds the holder's lease has left (0 when unknown). Between attempts the
    waiter sleeps as :class:`WaitClock` says: until its wake-up message, the holder's
    TTL, ``max_poll`` or the deadline; a message that says a release granted the
    lease ends the wait without another attempt. Unless granted, ``leave()`` removes
    the waiter from the queue on the way out and returns the fence of a lease granted
    to it meanwhile (else 0): on a timeout that lease is kept (it was granted in
    time), on an exception or interrupt ``release()`` gives it up.

    A connection error of an attempt made while waiting (a failover, a restart) does
    not end the wait: the waiter asks again every ``max_poll`` seconds (a Sentinel-
    managed client then reaches the new primary) until its deadline, and raises the
    error if it still has no answer then (or after :data:`OUTAGE_GRACE` seconds of
    errors without a deadline). It never outlives its deadline.
    """
    clock = WaitClock(deadline, max_poll)
    notifier = Notifier.for_client(client)
    heard: list[Waiter] = []  # the waiter, so a grant it heard is known on the way out
    try:
        with notifier.listen(channel, token, deadline) as waiter:
            heard.append(waiter)
            steps = clock.rounds(waiter)
            outcome: Grant | int | None = None
            error: Exception | None = None
            while True:
                try:
                    step = steps.send(outcome) if error is None else steps.throw(error)
                except StopIteration as stop:
                    grant: Grant | None = stop.value
                    if grant is not None:
                        return grant
                    break
                outcome = error = None
                if step is ATTEMPT:
                    try:
                        outcome = attempt()
                    except OUTAGE_ERRORS as exc:
                        error = exc
                else:
                    notifier.wait(waiter, step)
    except BaseException:
        # A grant that reached the waiter (by message, or found by leave()) is given
        # back, never left to sit for a whole TTL: leave() failing does not hide one.
        with _grace(deadline):
            fence = _leave_quietly(leave) or _heard_fence(heard)
            with contextlib.suppress(RedisError):
                if fence:
                    release()
        raise
    with _grace(deadline):
        return clock.granted(_leave_quietly(leave) or _heard_fence(heard))


def _grace(deadline: float | None) -> contextlib.AbstractContextManager[None]:
    """Leaving the queue (and giving back a grant) may take :data:`LEAVE_GRACE` past
    the caller's deadline, and no longer: with Redis paused the heartbeat lapses."""
    if deadline is None:
        return contextlib.nullcontext()
    return reply_deadline(max(deadline, time.monotonic()) + LEAVE_GRACE)


def _heard_fence(heard: list[Waiter]) -> int:
    """The fence of a grant the waiter was told of by message, else 0."""
    return heard[0].fence if heard else 0


def _leave_quietly(leave: Callable[[], int]) -> int:
    """``leave()``, or 0 when Redis cannot be reached (the heartbeat lapses instead)."""
    try:
        return leave()
    except RedisError:
        return 0
