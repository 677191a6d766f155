"""One Redlock round: the lock scripts run on every master at once, the replies
counted against the majority.

The scripts are the single-server lock's own (``lock_acquire.lua``,
``lock_release.lua``, ``lock_extend.lua``, ``queue_leave.lua``, ...), and where an
operation of the single-server lock exists (release, extend, held, leave, adopt,
release_owner: :class:`~celery_redislock.core.lock_scripts.LockScripts`) it is that
operation, run on every master (:func:`run`); only the acquire round (with the boot
marker and the fence proposal) and the fence floor (``redlock_floor.lua``) are
Redlock's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from redis.typing import KeyT

from ..lock_scripts import (
    ACQUIRE,
    RELEASE,
    SCRIPT_CONSTANTS,
    acquire_reply,
    refusal_holder,
    refusal_wait_ms,
)
from ..operations import Operation
from ..scripts import LuaScript, ScriptReply
from ..waiting import Grant
from .fanout import Enough, drive, fan_out
from .masters import Call, Master

T = TypeVar("T")

__all__ = [
    "ACQUIRE",
    "FLOOR",
    "RELEASE",
    "Round",
    "Verdict",
    "attempt",
    "confirmed",
    "errors_text",
    "granted",
    "raise_floors",
    "run",
    "verdict",
]

FLOOR = LuaScript("redlock_floor.lua", SCRIPT_CONSTANTS)


@dataclass
class Round:
    """The outcome of one acquire attempt on every master."""

    grants: dict[int, Grant] = field(default_factory=dict)  # master index -> grant
    refused: dict[int, list[ScriptReply]] = field(default_factory=dict)  # master -> refusal
    errors: dict[int, BaseException] = field(default_factory=dict)
    late: list[int] = field(default_factory=list)  # asked, not read: a majority granted

    @property
    def answered(self) -> int:
        """How many masters answered (granted or refused)."""
        return len(self.grants) + len(self.refused)

    def wait_hint(self) -> float:
        """Seconds until a refusing master may grant (its holder's TTL left, or the
        rest of a restart grace); 0 when unknown."""
        waits = [wait for wait in map(refusal_wait_ms, self.refused.values()) if wait > 0]
        return min(waits) / 1000.0 if waits else 0.0

    def restarting(self) -> list[int]:
        """Masters that refused because they restarted within the grace."""
        return [i for i, reply in self.refused.items() if len(reply) > 3]

    def holder(self) -> str | None:
        """The owner id a refusing master named, if any."""
        for reply in self.refused.values():
            if holder := refusal_holder(reply):
                return holder
        return None


def attempt(masters: list[Master], call: Call, ttl_ms: int, timeout: float) -> Round:
    """Send ``call`` (``lock_acquire.lua``) to every master; sort the replies."""
    sent_at = time.monotonic()
    outcome = Round()
    quorum = len(masters) // 2 + 1
    answers = fan_out(masters, call, timeout, (quorum, granted))
    for index, answer in enumerate(answers):
        if isinstance(answer, int):  # the commonest: a new lease's fence
            outcome.grants[index] = (answer, sent_at)
        elif answer is None:
            outcome.late.append(index)
        elif isinstance(answer, BaseException):
            outcome.errors[index] = answer
        elif not isinstance(answer, list):
            outcome.errors[index] = TypeError(f"{call.script.name} answered {answer!r:.200}")
        elif (grant := acquire_reply(answer, sent_at, ttl_ms)) is None:
            outcome.refused[index] = answer
        else:
            outcome.grants[index] = grant
    return outcome


def granted(answer: object) -> bool:
    """True for a ``lock_acquire.lua`` reply that grants (a fence, or {1, ...})."""
    return isinstance(answer, int) or (isinstance(answer, list) and answer[0] == 1)


def confirmed(answer: object) -> bool:
    """True for a release's or an extend's 1."""
    return answer == 1


Verdict = Literal["held", "gone", "unknown"]


def verdict(answers: Sequence[object], quorum: int, holds: Callable[[object], bool]) -> Verdict:
    """One lease's outcome from each master's answer about it: ``"held"`` when a
    majority's answer ``holds`` it; ``"gone"`` when fewer than a majority can still
    hold it (the others answered 0 or False: not held there); else ``"unknown"`` (too
    few answered: masters stalled or down). The majority rule of extend, held and
    renewal alike."""
    if sum(1 for answer in answers if holds(answer)) >= quorum:
        return "held"
    gone = sum(1 for answer in answers if answer == 0)  # False == 0; errors never are
    return "gone" if len(answers) - gone < quorum else "unknown"


def raise_floors(
    masters: list[Master], fence_key: KeyT, grants: dict[int, Grant], fence: int, timeout: float
) -> int:
    """Raise the fence counter of every granting master below ``fence`` to it; return
    how many granting masters store a fence >= ``fence`` (at least a majority, when
    enough of them answered). Waits only for as many as a majority needs: when the
    masters that granted ``fence`` itself are a majority already, the others are sent
    the floor and not waited for."""
    stored = sum(1 for given, _ in grants.values() if given >= fence)
    lower = [index for index, (given, _) in grants.items() if given < fence]
    if lower:
        need = max(0, len(masters) // 2 + 1 - stored)
        replies = fan_out(
            [masters[i] for i in lower],
            Call(FLOOR, [fence_key], [fence]),
            timeout,
            (need, confirmed),
        )
        stored += sum(1 for reply in replies if reply == 1)
    return stored


def run(
    masters: list[Master],
    indexes: list[int],
    operation: Callable[[], Operation[T]],
    timeout: float,
    enough: Enough | None = None,
) -> dict[int, T | BaseException | None]:
    """Run ``operation`` (a single-server one, see :func:`~.fanout.drive`) on
    ``masters[i]`` for each ``i`` in ``indexes``; each master's result by index."""
    if not indexes:
        return {}
    chosen = masters if len(indexes) == len(masters) else [masters[i] for i in indexes]
    return dict(zip(indexes, drive(chosen, operation, timeout, enough), strict=True))


def errors_text(masters: list[Master], errors: dict[int, BaseException]) -> str:
    """``host:port: error; ...`` for the masters that failed."""
    return "; ".join(
        f"{masters[i].label}: {type(exc).__name__}: {exc}" for i, exc in sorted(errors.items())
    )


def adopt(
    masters: list[Master],
    operation: Callable[[], Operation[Grant | None]],
    quorum: int,
    timeout: float,
) -> tuple[list[Grant], list[int]]:
    """Hand a lease over to a new token on every master (``LockScripts.adopt``).

    Returns (grants, adopted): the masters' grants, latest first, and the masters
    that adopted -- the caller gives back what a minority adopted.
    """
    results = run(masters, list(range(len(masters))), operation, timeout)
    grants = {i: grant for i, grant in results.items() if isinstance(grant, tuple)}
    return sorted(grants.values(), key=lambda grant: grant[1], reverse=True), sorted(grants)
