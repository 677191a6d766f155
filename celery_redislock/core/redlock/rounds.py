"""One Redlock round: the lock scripts run on every master at once, the replies
counted against the majority.

The scripts are the single-server lock's own (``lock_acquire.lua``,
``lock_release.lua``, ``lock_extend.lua``, ``queue_leave.lua``, ``lock_info.lua``),
read by the same code (:mod:`~celery_redislock.core.lock_scripts`); only the fence
floor (``redlock_floor.lua``) is Redlock's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from redis.typing import EncodableT, KeyT

from ..lock_scripts import (
    ACQUIRE,
    ADOPT,
    EXTEND,
    LEAVE,
    RELEASE,
    RELEASE_OWNER,
    SCRIPT_CONSTANTS,
    acquire_reply,
    adopt_reply,
    refusal_holder,
    refusal_wait_ms,
)
from ..scripts import LuaScript
from ..waiting import Grant
from .fanout import Enough, fan_out
from .masters import Call, Master

__all__ = [
    "ACQUIRE",
    "ADOPT",
    "EXTEND",
    "FLOOR",
    "LEAVE",
    "RELEASE",
    "RELEASE_OWNER",
    "Round",
    "attempt",
    "confirmed",
    "errors_text",
    "granted",
    "raise_floors",
    "run_call",
    "run_each",
]

FLOOR = LuaScript("redlock_floor.lua", SCRIPT_CONSTANTS)


@dataclass
class Round:
    """The outcome of one acquire attempt on every master."""

    grants: dict[int, Grant] = field(default_factory=dict)  # master index -> grant
    refused: dict[int, list[object]] = field(default_factory=dict)  # master -> refusal
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


def run_each(
    masters: list[Master],
    indexes: list[int],
    script: LuaScript,
    keys: list[KeyT],
    args: list[EncodableT],
    timeout: float,
    enough: Enough | None = None,
) -> dict[int, object]:
    """Run one script with the same KEYS/ARGV on ``masters[i]`` for each ``i`` in
    ``indexes``; see :func:`run_call`."""
    return run_call(masters, indexes, Call(script, keys, args), timeout, enough)


def run_call(
    masters: list[Master],
    indexes: list[int],
    call: Call,
    timeout: float,
    enough: Enough | None = None,
) -> dict[int, object]:
    """Send ``call`` to ``masters[i]`` for each ``i`` in ``indexes``; each master's
    reply or exception by index (None: not read, the round ended when ``enough``
    answered: see :func:`~.fanout.fan_out`)."""
    if not indexes:
        return {}
    chosen = masters if len(indexes) == len(masters) else [masters[i] for i in indexes]
    return dict(zip(indexes, fan_out(chosen, call, timeout, enough), strict=True))


def errors_text(masters: list[Master], errors: dict[int, BaseException]) -> str:
    """``host:port: error; ...`` for the masters that failed."""
    return "; ".join(
        f"{masters[i].label}: {type(exc).__name__}: {exc}" for i, exc in sorted(errors.items())
    )


def adopt(
    masters: list[Master],
    keys: list[KeyT],
    args: list[EncodableT],
    ttl_ms: int,
    quorum: int,
    timeout: float,
) -> tuple[int, float, list[int]]:
    """Hand a lease over to a new token on every master (``lock_adopt.lua``).

    Returns (fence, sent_at, adopted): the largest fence and the masters that
    adopted, when a majority did; else (0, sent_at, adopted) -- the caller gives back
    what a minority adopted.
    """
    sent_at = time.monotonic()
    replies = run_each(masters, list(range(len(masters))), ADOPT, keys, args, timeout)
    grants = {
        i: adopt_reply(reply, sent_at, ttl_ms)
        for i, reply in replies.items()
        if isinstance(reply, list)
    }
    fences = {i: grant[0] if grant else 0 for i, grant in grants.items()}
    adopted = [i for i, fence in fences.items() if fence]
    if len(adopted) >= quorum:
        return max(fences[i] for i in adopted), sent_at, adopted
    return 0, sent_at, adopted
