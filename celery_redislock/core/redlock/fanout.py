"""One script on every Redlock master at once, from the calling thread: :func:`fan_out`.

A fan-out sends the request on every master's connection first and then reads the
replies as they arrive, through redis-py's public ``Connection`` calls
(``send_packed_command``, ``can_read``, ``read_response``), so its latency is one
master's round trip, not the sum, and it costs no thread hand-off. Measured on the
development machines (benchmarks/bench_redlock.py, 5 masters): a thread pool per
round cost 1.2-1.4x this, ``redis.asyncio`` driven from the sync call 1.4-2x. So
each master keeps connections of its own (:class:`~.masters.Link`), one per thread
in flight.

A round that only needs a majority (a grant, a release, an extend) ends as soon as
enough masters gave the answer that counts (``enough``): the others' replies are left
on their connections, which keep the calls still due (:attr:`.Link.due`) and are used
again as they are -- the next request on a connection goes after the ones before it
(Redis runs one connection's requests in order), and its reply is read after theirs,
each checked against its own call's stamp. So the slowest masters' work overlaps the
client's next step instead of adding to the latency, and a stopped minority costs a
round nothing.

While no reply is there, the round waits on one connection at a time (redis-py
offers no wait on several) for at most :data:`WAIT_SLICE`, looking at every other
connection in between: a master that stopped answering delays a round by one slice,
not by the call's deadline. A master that does not answer before the call's
deadline, or fails, is reported as its exception and its connection closed (a late
reply must never be read as the answer to a later request); so is a connection whose
oldest due reply is overdue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT

from ..operations import Call as ScriptCall
from ..operations import Operation
from ..scripts import ScriptReply
from .masters import IO_TIMEOUT, Call, Due, Link, Master

__all__ = ["MAX_DUE", "WAIT_SLICE", "Enough", "drive", "fan_out"]

log = logging.getLogger(__name__)

MAX_DUE = 3
"""Most replies a connection may owe: a master that owes this many is not sent the
round's request until it has caught up -- its owed replies are read as they arrive
during the round, and it is sent the request once it owes fewer; the round waits for
it only while the masters that were sent the request cannot make ``enough`` without
it (else it counts as not answering, at no cost to the round). Its connection is
closed once the oldest reply is overdue. A stopped master's requests do not pile up,
and it never costs a round that a majority decides its deadline."""

WAIT_SLICE = 0.001
"""Longest wait, in seconds, on one master's connection while the others are looked
at only in between (see the module docs)."""

T = TypeVar("T")

Answer: TypeAlias = "ScriptReply | BaseException"
"""One master's answer in a round: its reply's payload, or the error it answered with
(a ``redis.TimeoutError`` when it did not answer in time); None also when not read."""

Enough = tuple[int, Callable[[object], bool]]
"""``(count, counts)``: a round may end once ``count`` masters answered with a reply
for which ``counts(reply)`` is true (0: as soon as every request is sent)."""


def fan_out(
    masters: Sequence[Master],
    call: Call | Sequence[Call],
    timeout: float,
    enough: Enough | None = None,
) -> list[Answer]:
    """Send ``call`` to every master at once (or ``call[i]`` to ``masters[i]``); wait
    until every master answered, ``enough`` of them did (see :data:`Enough`), or
    ``timeout`` seconds passed since the last was sent (a new connection's handshake
    comes before its request and is bounded by :data:`~.masters.IO_TIMEOUT`).

    Returns one entry per master: its reply's payload; the exception it answered with
    (a ``RedisError``; a ``redis.TimeoutError`` when it did not answer in time); or
    None when the round ended before its reply (read later on the same connection).
    A NOSCRIPT reply is answered by sending the script itself on the same connection.
    """
    count = len(masters)
    calls = [call] * count if isinstance(call, Call) else list(call)
    results: list[Answer] = [None] * count
    links = [master.take() for master in masters]
    pending: list[int] = []
    expires = time.monotonic() + timeout
    fresh: list[int] = []  # to connect first: sent last (a handshake may be slow)
    idle: set[int] = set()  # sent on a connection that owed nothing: see below
    behind: list[int] = []  # owing MAX_DUE replies: sent the request once caught up
    for index, link in enumerate(links):
        owed = bool(link.due)
        if not link.connected:
            fresh.append(index)
        elif _started(masters[index], link, calls[index], expires, results, index):
            pending.append(index)
            if not owed:
                idle.add(index)
        elif isinstance(results[index], Behind):
            behind.append(index)
        elif not owed and not link.connected:  # closed while idle (the write failed)
            fresh.append(index)
    for index in fresh:
        if _connected(masters[index], links[index], calls[index], expires, results, index):
            pending.append(index)
    need, counts = enough if enough is not None else (count + 1, None)
    good = 0
    deadline = time.monotonic() + timeout
    empty: dict[int, int] = {}  # master index -> waits on it that found nothing
    # A master that is behind is waited for only while the round needs it: once the
    # masters sent the request all answered, the round goes on only if the behind ones
    # could still make ``enough`` (never when every master's answer is wanted: need is
    # then count + 1). Its owed replies are read as they arrive, and once it owes fewer
    # than MAX_DUE it is sent the request: a master that is slow, not stopped, catches
    # up and answers instead of being counted as not answering round after round (a
    # burst of rounds outruns it; a held() that needed it was RedlockUnavailable).
    while good < need and (pending or (behind and good + len(behind) >= need)):
        left = deadline - time.monotonic()
        if left <= 0:
            for index in pending:
                results[index] = RedisTimeoutError(
                    f"{masters[index].label} did not answer within the call's deadline"
                )
                links[index].drop()
            break  # the behind keep their connections: their replies are still to come
        # Wait on the connection owing the fewest earlier replies (one that owes more
        # is behind: the likeliest to be slow) and found empty the fewest times; then
        # read what every connection has.
        index = min(pending or behind, key=lambda i: (len(links[i].due), empty.get(i, 0)))
        try:
            if not links[index].conn.can_read(min(left, WAIT_SLICE)):
                empty[index] = empty.get(index, 0) + 1
        except (RedisError, OSError):
            pass  # read (and reported) below
        for index in list(pending):
            link = links[index]
            try:
                done, reply = _poll(link, calls[index])
            except (RedisConnectionError, OSError) as exc:
                # A connection that owed nothing and is found closed was closed by its
                # server while idle (its ``timeout``, ``CLIENT KILL``, a proxy): the
                # request is sent again on a new one (as redis-py's pool reconnects a
                # connection it finds closed), not counted as a master that did not
                # answer. Every script answers a re-send as its first execution.
                if index in idle:
                    idle.discard(index)
                    if _connected(masters[index], link, calls[index], expires, results, index):
                        continue
                done, reply = True, results[index] or exc
                link.drop()
            except RedisError as exc:
                done, reply = True, exc
                link.drop()
            if done:
                pending.remove(index)
                results[index] = reply
                if counts is not None and counts(reply):
                    good += 1
        for index in list(behind):  # read what arrived; sent the request once caught up
            if _started(masters[index], links[index], calls[index], expires, results, index):
                behind.remove(index)
                pending.append(index)
            elif not isinstance(results[index], Behind):  # overdue or failed: closed
                behind.remove(index)
    for master, link in zip(masters, links, strict=True):
        master.give_back(link)
    return results


def drive(
    masters: Sequence[Master],
    operation: Callable[[], Operation[T]],
    timeout: float,
    enough: Enough | None = None,
) -> list[T | BaseException | None]:
    """Run one of the single-server operations (``core/operations.py``, e.g.
    ``LockScripts.extend``) on every master at once: ``operation()`` made once per
    master, each call it yields sent to all that still run it in one fan-out (packed
    once when they are the same), its reply sent back into it.

    Returns each master's result; the exception its call raised (a ``RedisError``,
    a ``redis.TimeoutError`` when it did not answer in time); or None when the round
    ended (``enough``, as in :func:`fan_out`) before its reply was read. The majority
    is the caller's to count: an operation decides what one server's reply means.
    """
    count = len(masters)
    results: list[T | BaseException | None] = [None] * count
    running: dict[int, Operation[T]] = {}
    asked: dict[int, ScriptCall] = {}
    for index in range(count):
        operation_ = operation()
        try:
            asked[index] = next(operation_)
            running[index] = operation_
        except StopIteration as stop:
            results[index] = stop.value
    while running:
        indexes = list(running)
        first = asked[indexes[0]]
        shared = Call(first.script, first.keys, first.args)  # one packing when the same
        calls = [
            shared if asked[i] == first else Call(asked[i].script, asked[i].keys, asked[i].args)
            for i in indexes
        ]
        replies = fan_out([masters[i] for i in indexes], calls, timeout, enough)
        for index, reply in zip(indexes, replies, strict=True):
            operation_ = running.pop(index)
            if reply is None or isinstance(reply, BaseException):
                results[index] = reply  # not read, or failed: that master is done
                operation_.close()
                continue
            try:
                asked[index] = operation_.send(reply)
                running[index] = operation_
            except StopIteration as stop:
                results[index] = stop.value
            except Exception as exc:  # a reply the operation could not read
                results[index] = exc
    return results


def _connected(
    master: Master, link: Link, call: Call, expires: float, results: list[Answer], index: int
) -> bool:
    """Connect ``link`` and send ``call`` on it; False (and the error in
    ``results[index]``) when that failed."""
    try:
        master.connect(link)
    except (RedisError, OSError) as exc:
        results[index] = exc
        return False
    return _started(master, link, call, expires, results, index)


def _started(
    master: Master, link: Link, call: Call, expires: float, results: list[Answer], index: int
) -> bool:
    """Send ``call`` on ``link`` after the replies it owes are caught up with; False
    (and the error in ``results[index]``) when that failed."""
    try:
        if link.due:
            _catch_up(link, master.label)
        if call.keys_for is None and not call.packed.get(master.encoding):
            call.packed[master.encoding] = _pack(link, call, call.keys)
        _send(link, call, expires, call.packed.get(master.encoding))
    except Behind as exc:
        results[index] = exc  # the connection is kept: its replies are still to come
        return False
    except (RedisError, OSError) as exc:
        results[index] = exc
        link.drop()
        return False
    return True


def _send(
    link: Link,
    call: Call,
    expires: float,
    packed: list[bytes] | None = None,
    with_text: bool = False,
) -> None:
    """Send ``call`` on ``link`` (``packed``: as packed already), its reply due by
    ``expires``; ``with_text``: as ``EVAL`` with the script's text."""
    keys = call.keys if call.keys_for is None else call.keys_for(link.run_id)
    if packed is None:
        packed = _pack(link, call, keys, with_text)
    link.conn.send_packed_command(packed, check_health=False)
    link.due.append(Due(call, keys, expires))


def _pack(link: Link, call: Call, keys: list[KeyT], with_text: bool = False) -> list[bytes]:
    script = call.script
    command, body = ("EVAL", script.text) if with_text else ("EVALSHA", script.sha)
    return link.conn.pack_command(command, body, len(keys), *keys, *call.args)


def _poll(link: Link, call: Call | None) -> tuple[bool, Answer]:
    """Read the replies ``link`` has without waiting: ``(True, payload)`` once the
    reply to ``call`` is in (its payload, or the error it answered with), else
    ``(False, None)``. Replies due before it are checked and dropped; ``StaleReply``
    for one that is not its call's. A NOSCRIPT (the script did not run) sends the
    script itself, due again."""
    due, conn = link.due, link.conn
    while due and conn.can_read(0):
        try:
            reply = conn.read_response(disable_decoding=True)
        except ResponseError as exc:  # an error reply: the connection is clean
            reply = exc
        owed = due.popleft()
        if isinstance(reply, NoScriptError):
            _send(link, owed.call, time.monotonic() + IO_TIMEOUT, with_text=True)
            continue
        payload = (
            reply
            if isinstance(reply, Exception)
            else owed.call.script.checked(reply, owed.call.args)
        )
        if owed.call is call:
            return True, payload
        if isinstance(payload, Exception):
            log.debug("celery_redislock: an earlier Redlock request failed: %r", payload)
    return False, None


def _catch_up(link: Link, label: str) -> None:
    """Before a new request: read the replies ``link`` owes that are there already;
    raise ``TimeoutError`` when the oldest is overdue (the caller closes the
    connection), or :class:`Behind` while it still owes :data:`MAX_DUE`."""
    due = link.due
    _poll(link, None)
    if due and due[0].expires <= time.monotonic():
        raise RedisTimeoutError(f"{label} did not answer an earlier request within its deadline")
    if len(due) >= MAX_DUE:
        raise Behind(f"{label} still owes {len(due)} replies: not sent this request")


class Behind(RedisTimeoutError):
    """A master's connection owes :data:`MAX_DUE` replies, none overdue yet: this round
    counts it as not answering and keeps the connection (see :data:`MAX_DUE`)."""
