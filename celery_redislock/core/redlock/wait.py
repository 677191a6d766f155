"""A blocking Redlock acquire: rounds until a majority grants, woken by releases.

The waiter queues on every master with one ticket (its place is the same in every
master's queue, so they all name the same head) and listens on the first master that
answered: a release there wakes it (or hands it that master's lease), and it asks
every master again. A split round (grants on a minority, most often a release still
on its way to the others) is asked again soon, keeping the grants, up to
:data:`SPLIT_RETRIES` times; then they are given back and the waiter backs off a
random while (``retry_jitter``). It also polls, never later than the holder's TTL or
TTL/3, so a lost message costs latency only.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from typing import Protocol

from ...errors import RedlockUnavailable
from ..keys import KeySpace
from ..lock_scripts import LockScripts
from ..waiting import Notifier, poll_slice
from . import rounds
from .lease import RedlockLease
from .masters import Master

__all__ = ["SPLIT_RETRIES", "Waiting", "wait_for_lease"]

SPLIT_RETRIES = 4
"""Rounds a waiter asks again after a split, keeping a minority's grants (the first
at once, then after 1, 2, 4 ms: a release whose sender was preempted between two
masters reaches the others a scheduler slice later), before it gives them back and
waits a random while (see the module docs)."""


class Waiting(Protocol):
    """What waiting uses of a :class:`~.lock.RedlockLock` (a protocol, so this module
    never imports the lock's, which imports it)."""

    quorum: int
    _keys: KeySpace
    _masters: list[Master]
    _scripts: LockScripts
    _timeout: float
    _jitter: float

    def _try(
        self,
        token: str,
        owner: str | None,
        ttl_ms: int,
        ticket: int = 0,
        give_back: bool = True,
        floor: int = 0,
    ) -> tuple[RedlockLease | None, rounds.Round]: ...

    def _unavailable(self, outcome: rounds.Round) -> RedlockUnavailable: ...


def wait_for_lease(
    lock: Waiting, token: str, tag: str, owner: str | None, ttl_ms: int, deadline: float
) -> RedlockLease | None:
    """Rounds until granted or ``deadline``; queued on every master meanwhile, so a
    release wakes this waiter (on the first master that answered)."""
    channel = f"{lock._keys.channel}:{tag}"
    outcome = rounds.Round()
    granted = False
    ticket = time.time_ns() // 1000  # one place in every master's queue
    splits = 0
    try:
        with contextlib.ExitStack() as stack:
            notifier, waiter = Notifier.for_client(lock._masters[0].client), None
            if notifier.subscribed(channel):  # waited here lately: listen at once
                waiter = stack.enter_context(notifier.listen(channel, token))
            while True:
                if waiter is not None:
                    waiter.notified = False
                # A split (grants on a minority) is most often a release still on
                # its way to the other masters: ask again soon, keeping what was
                # granted, before giving it back and backing off with jitter. (Given
                # back, a grant goes to that master's next waiter while this one is
                # still first on the others: both split until one backs off.)
                keep = splits < SPLIT_RETRIES
                # Handed a lease by a release (its fence in the wake-up): propose that
                # fence, which the other masters (whose counters stand at the last
                # holder's fence) grant too while it is ahead of their clocks -- one
                # fence everywhere, no floor to raise.
                floor = waiter.fence if waiter is not None else 0
                lease, outcome = lock._try(token, owner, ttl_ms, ticket, not keep, floor)
                if lease is not None:
                    granted = True
                    return lease
                splits = splits + 1 if outcome.grants and splits < SPLIT_RETRIES else 0
                if splits:
                    if splits > 1:
                        time.sleep(
                            min(0.001 * 2 ** (splits - 2), max(0.0, deadline - time.monotonic()))
                        )
                    continue
                if waiter is None and outcome.answered:
                    first = min([*outcome.grants, *outcome.refused])
                    notifier = Notifier.for_client(lock._masters[first].client)
                    waiter = stack.enter_context(notifier.listen(channel, token))
                    continue  # once subscribed, ask again: no release missed
                sleep = min(outcome.wait_hint() or math.inf, poll_slice(ttl_ms))
                if outcome.grants or outcome.errors:  # a split or a failure
                    sleep = min(sleep, random.uniform(0, lock._jitter) + 0.001)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sleep = min(sleep * random.uniform(0.8, 1.0), left)
                if waiter is not None:
                    notifier.wait(waiter, sleep)
                else:
                    time.sleep(sleep)
    finally:
        # Out of the queues: where refused (or silent) when granted, else everywhere.
        _leave(
            lock,
            token,
            granted,
            sorted({*outcome.refused, *outcome.errors, *outcome.late})
            if granted
            else list(range(len(lock._masters))),
        )
    if outcome.answered < lock.quorum:
        raise lock._unavailable(outcome)
    return None


def _leave(lock: Waiting, token: str, granted: bool, indexes: list[int]) -> None:
    """Leave the wait queue on ``masters[i]`` for each i in ``indexes``; a lease a
    release granted meanwhile is given back unless the wait ended granted (the
    lease's release then reaches it with the others)."""
    # Granted, the replies are not needed (a lease granted meanwhile is released with
    # the others): sent, not waited for.
    scripts = lock._scripts
    left = rounds.run(
        lock._masters,
        indexes,
        lambda: scripts.leave(token),
        lock._timeout,
        (0, rounds.confirmed) if granted else None,
    )
    stray = [i for i, fence in left.items() if isinstance(fence, int) and fence]
    if stray and not granted:
        rounds.run(lock._masters, stray, lambda: scripts.release(token), lock._timeout)
