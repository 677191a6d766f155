"""The async blocking acquire: the wait's rounds (:meth:`~celery_redislock.core.
waiting.WaitClock.rounds`, the sync wait's own) driven with ``await``.

A waiter joins its loop's subscriber (:mod:`.notifier`), then alternates attempts
and waits for its wake-up message exactly as the sync waiter does: a message that
says a release granted it the lease ends the wait with no round trip, a plain one
makes it ask again, and it polls at most every ``max_poll`` seconds and never later
than the holder's TTL. Connection errors are ridden out as :meth:`WaitClock.failed`
says. On a timeout it leaves the queue and keeps a lease granted meanwhile; on any
exception or cancellation the caller gives the token up
(:meth:`.primitive.AsyncPrimitive._give_up`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from ..core.waiting import ATTEMPT, MAX_POLL, OUTAGE_ERRORS, Grant, WaitClock
from ..core.waiting import _grace as grace
from .notifier import AsyncNotifier, AsyncWaiter

__all__ = ["wait_until_granted"]


async def wait_until_granted(
    notifier: AsyncNotifier,
    channel: str,
    token: str,
    attempt: Callable[[], Awaitable[Grant | int]],
    leave: Callable[[], Awaitable[int]],
    deadline: float | None,
    max_poll: float = MAX_POLL,
) -> Grant | None:
    """Wait, queued as ``token``, until a lease is granted or ``deadline`` passes (see
    the sync :func:`~celery_redislock.core.waiting.wait_until_granted` for
    ``attempt`` and ``leave``); None when the deadline passed ungranted."""
    clock = WaitClock(deadline, max_poll)
    waiter: AsyncWaiter | None = None
    grant: Grant | None = None
    try:
        waiter = await notifier.join(channel, token, deadline)
        steps = clock.rounds(waiter)
        outcome: Grant | int | None = None
        error: Exception | None = None
        while True:
            try:
                step = steps.send(outcome) if error is None else steps.throw(error)
            except StopIteration as stop:
                grant = stop.value
                break
            outcome = error = None
            if step is ATTEMPT:
                try:
                    outcome = await attempt()
                except OUTAGE_ERRORS as exc:
                    error = exc
            else:
                await notifier.wait(waiter, step)
    finally:
        notifier.leave(channel, token)
    if grant is not None:
        return grant
    try:
        with grace(deadline):  # leaving may take LEAVE_GRACE past the deadline, no more
            fence = await leave()
    except RedisError:  # unreachable: the heartbeat lapses instead
        fence = 0
    # A grant heard by message is kept even when leave() could not say so.
    return clock.granted(fence or (waiter.fence if waiter is not None else 0))
