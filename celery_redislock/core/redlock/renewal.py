"""Redlock leases renewed by the process's one renewer (``core/renewal``), by majority.

The renewer's scheduler decides which leases to renew and when, and when a lease is
lost, for every lease alike (the tick, batch and loss rules of ``core/renewal``).
Its senders do the network calls, one per Redis client; the leases of a Redlock
are renewed by a :class:`MajoritySender`, one per set of masters: one batch call
(``lock_renew.lua``, the single-server lock's own) sent to every master at once
(:func:`~.fanout.fan_out`), each lease judged by the masters' answers for it:

* renewed on a majority: confirmed until the majority's new expiry, less the
  clock-drift allowance (the time the call was sent plus its TTL, less the drift);
* fewer than a majority can still hold it (the others answered 0): lost now;
* otherwise (too few answered: masters down or stalled): retried, and lost at its
  deadline if no majority confirms it before -- as a single-server lease whose
  Redis does not answer.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import ClassVar, Literal

from ..lock_scripts import RENEW
from ..renewal.entry import Entry, Reply
from ..renewal.sender import Sender, batch_call, check_batch_reply
from ..scripts import LuaScript
from .fanout import fan_out
from .masters import Call, Master
from .rounds import Verdict, verdict

__all__ = ["MajoritySender", "MasterSet", "RenewedOn"]


class MasterSet:
    """The masters of one or more Redlock locks, as the renewer's "client": the key
    of their :class:`MajoritySender` (one per set of masters in the process)."""

    renewal_sender: ClassVar[type[Sender]]
    """The sender the renewer makes for this client (see ``renewal/scheduler.py``)."""

    _registry: ClassVar[weakref.WeakValueDictionary[tuple[int, ...], MasterSet]] = (
        weakref.WeakValueDictionary()
    )
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, masters: list[Master]) -> MasterSet:
        """The process's set of these ``masters`` (in this order)."""
        key = tuple(id(master) for master in masters)
        with cls._registry_lock:
            found = cls._registry.get(key)
            if found is None:
                found = cls._registry[key] = cls(masters)
            return found

    def __init__(self, masters: list[Master]) -> None:
        self.masters = masters
        self.quorum = len(masters) // 2 + 1

    def __repr__(self) -> str:
        return f"<MasterSet {[master.label for master in self.masters]}>"


class RenewedOn:
    """What the renewer renews one Redlock lock's leases as (its ``Renewable``): the
    lock's masters, its keys and script, its round timeout and drift allowance."""

    __slots__ = ("_holders", "client", "drift_s", "timeout")

    _renew_script: ClassVar[LuaScript] = RENEW

    def __init__(
        self, masters: MasterSet, holders: str, timeout: float, drift_s: Callable[[int], float]
    ) -> None:
        self.client = masters
        self._holders = holders
        self.timeout = timeout
        self.drift_s = drift_s  # seconds taken off a lease of ttl_ms's validity

    @property
    def _renew_keys(self) -> tuple[str, ...]:
        return (self._holders,)


class MajoritySender(Sender):
    """Sends the renewals of the leases on one :class:`MasterSet` from its own thread
    (through the masters' own connections: none of its own to open)."""

    def _open(self) -> None:
        pass  # the masters' connections serve, one per thread (see masters.py)

    def close(self) -> None:
        pass

    def _send(self, script: LuaScript, items: list[tuple[Entry, int]]) -> None:
        masters = self.client
        assert isinstance(masters, MasterSet)  # this sender is made for MasterSets only
        holders = [entry.holder for entry, _ in items]
        timeout = max(holder.timeout for holder in holders if isinstance(holder, RenewedOn))
        keys, args = batch_call(items)
        sent_at = time.monotonic()
        replies = _batch_replies(masters, Call(script, keys, args), items, timeout)
        decided: dict[float, list[Reply]] = {}  # by the drift allowance taken off
        unknown: list[Reply] = []
        for i, (entry, ttl_ms) in enumerate(items):
            answers = [reply[i] if isinstance(reply, list) else reply for reply in replies]
            verdict = _verdict(answers, masters.quorum)
            if verdict == "unknown":
                unknown.append((entry, ttl_ms, False))
                continue
            holder = entry.holder
            drift = holder.drift_s(ttl_ms) if isinstance(holder, RenewedOn) else 0.0
            renewed = None if verdict == "superseded" else verdict == "held"
            decided.setdefault(drift, []).append((entry, ttl_ms, renewed))
        for drift, replies_ in decided.items():
            self._on_replies(replies_, sent_at - drift, "")
        if unknown:
            errors = [
                f"{master.label}: {type(reply).__name__}: {reply}"
                for master, reply in zip(masters.masters, replies, strict=True)
                if isinstance(reply, BaseException)
            ]
            error = "; ".join(errors) or f"fewer than {masters.quorum} masters answered"
            self._on_replies(unknown, sent_at, error)


def _batch_replies(
    masters: MasterSet, call: Call, items: list[tuple[Entry, int]], timeout: float
) -> list[object]:
    """Each master's answer to the batch ``call``: its list of one answer per lease,
    or the error it gave (None: not read, the round ended once a majority renewed
    every lease)."""

    def renewed_all(reply: object) -> bool:
        return isinstance(reply, list) and all(answer in (1, 3) for answer in reply)

    replies = fan_out(masters.masters, call, timeout, (masters.quorum, renewed_all))
    checked: list[object] = []
    for reply in replies:
        answer: object = reply
        if isinstance(reply, list):
            try:
                answer = check_batch_reply(call.script, items, reply)
            except ValueError as exc:
                answer = exc
        checked.append(answer)
    return checked


def _verdict(answers: list[object], quorum: int) -> Verdict | Literal["superseded"]:
    """One lease's outcome from each master's answer for it (1 or 3: renewed; 2: live,
    its TTL set by an explicit extend since; 0: not held; else no answer)."""
    outcome = verdict(answers, quorum, lambda answer: answer in (1, 2, 3))
    if outcome == "held" and any(answer == 2 for answer in answers):
        return "superseded"
    return outcome


MasterSet.renewal_sender = MajoritySender
