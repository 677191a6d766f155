"""The async blocking acquire: the sync wait's decisions (:class:`~celery_redislock.
core.waiting.WaitClock`) driven with ``await``.

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

from ..core.waiting import MAX_POLL, OUTAGE_ERRORS, Grant, WaitClock
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
    try:
        waiter = await notifier.join(channel, token, deadline)
        while True:
            waiter.notified = False
            grant = clock.granted(waiter.fence)
            if grant is not None:
                return grant
            clock.asking()
            try:
                outcome = await attempt()
                clock.answered()
            except OUTAGE_ERRORS:
                if clock.failed():
                    raise
                outcome = 0
            if isinstance(outcome, tuple):
                return outcome
            sleep = clock.sleep_after(outcome)
            if sleep is None:
                break
            await notifier.wait(waiter, sleep, deadline)
    finally:
        notifier.leave(channel, token)
    try:
        with grace(deadline):  # leaving may take LEAVE_GRACE past the deadline, no more
            fence = await leave()
    except RedisError:  # unreachable: the heartbeat lapses instead
        fence = 0
    # A grant heard by message is kept even when leave() could not say so.
    return clock.granted(fence or (waiter.fence if waiter is not None else 0))
