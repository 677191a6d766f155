"""One script on every Redlock master at once, from the calling thread: :func:`fan_out`.

A fan-out writes the request to every master first and then reads the replies as
they arrive (``select`` over the sockets), so its latency is a master's round trip,
not the sum, and it costs no thread hand-off. Measured on the development machines
(benchmarks/bench_redlock.py): a thread pool per call cost about 3x this, and taking a
connection from redis-py's pool per master about 1.5x. So each master keeps
connections of its own (:class:`~.masters.Master`), one per thread in flight.

A round that only needs a majority (a grant, a release, an extend) ends as soon as
enough masters gave the answer that counts (``enough``): the others' replies are left
on their connections, which keep the calls still due (:mod:`.wire`) and are used again
as they are -- the next request on a connection goes after the ones before it (Redis
runs one connection's requests in order), and its reply is read after theirs, each
checked against its own call's stamp. So the slowest masters' work overlaps the
client's next step instead of adding to the latency, and a stopped minority costs a
round nothing.

A master that does not answer before the call's deadline, or fails, is reported as
its exception and its connection closed (a late reply must never be read as the
answer to a later request); so is a connection whose oldest due reply is overdue.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..scripts import StaleReply
from . import wire
from .masters import IO_TIMEOUT, Master
from .wire import Call

__all__ = ["MAX_DUE", "Enough", "PackedFor", "fan_out"]

log = logging.getLogger(__name__)

PackedFor = Callable[[int, str], bytes]
"""The request for master ``index`` whose server has run id ``run_id`` (when it
differs by master: see :class:`~.prepared.Prepared`)."""

Enough = tuple[int, Callable[[Any], bool]]
"""``(count, counts)``: a round may end once ``count`` masters answered with a reply
for which ``counts(reply)`` is true (0: as soon as every request is sent)."""

MAX_DUE = 3
"""Most replies a connection may owe: a round waits for the oldest before it sends one
more (a master that falls behind slows its client down; a stopped master's requests
do not pile up, it fails at the oldest's deadline)."""


def fan_out(
    masters: Sequence[Master],
    call: Call,
    timeout: float,
    enough: Enough | None = None,
    packed_for: PackedFor | None = None,
) -> list[Any]:
    """Send ``call`` to every master at once (``call.packed``, or ``packed_for(i,
    run_id)`` to ``masters[i]``); wait until every master answered, ``enough`` of them
    did (see :data:`Enough`), or ``timeout`` seconds passed since the last was sent (a
    new connection's handshake comes before its request and is bounded by
    :data:`~.masters.IO_TIMEOUT`).

    Returns one entry per master: its reply; the exception it answered with (a
    ``RedisError``; a ``redis.TimeoutError`` when it did not answer in time); or None
    when the round ended before its reply (read later on the same connection).
    A NOSCRIPT reply is answered by sending the script itself on the same connection.
    """
    count = len(masters)
    results: list[Any] = [None] * count
    conns: list[Any] = [None] * count
    pending: dict[int, int] = {}  # socket's fd -> master index
    now = time.monotonic()
    expires = now + timeout
    packed = call.packed
    owing: list[int] = []  # owing replies, or written by redis-py (TLS): sent after
    fresh: list[int] = []  # to connect to first: sent last (a handshake may be slow)

    def send(index: int, conn: Any) -> None:
        due = conn.redlock_due
        # Replies still due are read with this round's (one read for both), unless the
        # connection owes too many or the oldest is overdue.
        if due and (len(due) >= MAX_DUE or due[0][1] <= now):
            _catch_up(conn, masters[index].label)
        request = packed if packed_for is None else packed_for(index, conn.redlock_run_id)
        if conn.redlock_raw:
            wire.write(conn, request)
        else:
            conn.send_packed_command([request], check_health=False)
        due.append((call, expires, request))
        pending[conn.redlock_fd] = index

    for index, master in enumerate(masters):
        conns[index] = master.take()
    closed = _closed_idle(conns)
    # The common case inline (send's body): a connected raw socket owing nothing.
    for index, conn in enumerate(conns):
        if conn._sock is None or (closed and conn.redlock_fd in closed):
            fresh.append(index)
            continue
        if conn.redlock_due or not conn.redlock_raw:
            owing.append(index)
            continue
        request = packed if packed_for is None else packed_for(index, conn.redlock_run_id)
        try:
            wire.write(conn, request)
        except (RedisError, OSError) as exc:
            results[index] = _failed(conn, exc)
            conns[index] = None
            continue
        conn.redlock_due.append((call, expires, request))
        pending[conn.redlock_fd] = index
    all_raw = True
    for index in (*owing, *fresh) if owing or fresh else ():
        master, conn = masters[index], conns[index]
        try:
            if conn._sock is None or (closed and conn.redlock_fd in closed):
                conn.disconnect()
                master.connect(conn)  # first: the request may name the server's run id
            send(index, conn)
        except (RedisError, OSError) as exc:
            results[index] = _failed(conn, exc)
            conns[index] = None
            master.give_back(conn)  # disconnected: connected again on its next use
            continue
        all_raw = all_raw and conn.redlock_raw
    # A round may end early only when every connection is read here (see wire.py):
    # one read by redis-py is never left with a reply due.
    need, counts = enough if enough is not None and all_raw else (count + 1, None)
    good = 0
    deadline = time.monotonic() + timeout
    while pending and good < need:
        left = deadline - time.monotonic()
        ready = select.select(list(pending), [], [], left)[0] if left > 0 else []
        if not ready:
            for index in pending.values():
                results[index] = _failed(
                    conns[index],
                    RedisTimeoutError(
                        f"{masters[index].label} did not answer within the call's deadline"
                    ),
                )
                conns[index] = None
            pending.clear()
            break
        for fd in ready:
            index = pending[fd]
            conn = conns[index]
            try:
                done, reply = _receive(conn, call)
                if not done:
                    continue  # its reply is not all there yet
            except (RedisError, OSError) as exc:
                results[index] = _failed(conn, exc)
                conns[index] = None
            else:
                results[index] = reply
                if counts is not None and counts(reply):
                    good += 1
            del pending[fd]
    for master, conn in zip(masters, conns, strict=True):
        if conn is not None and conn._sock is not None:
            master.give_back(conn)
    return results


def _closed_idle(conns: list[Any]) -> list[int]:
    """The sockets among ``conns``' connected raw ones owing nothing that can be read:
    closed by their server meanwhile (its ``timeout``, ``CLIENT KILL``, a proxy), as
    one owing no reply has nothing else to read. Connected again before the request
    is written (as redis-py's pool checks a connection it hands out), not counted as
    a master that did not answer. One ``select`` for all, not polling each."""
    idle = [
        conn.redlock_fd
        for conn in conns
        if conn._sock is not None and not conn.redlock_due and conn.redlock_raw
    ]
    return select.select(idle, [], [], 0)[0] if idle else []


def _receive(conn: Any, call: Call | None) -> tuple[bool, Any]:
    """Read what ``conn`` has: ``(True, reply)`` once the reply to ``call`` is in
    (its payload, or the error it answered with), else ``(False, None)``. Replies due
    before it are checked and dropped; ``StaleReply`` for one that is not its call's."""
    due = conn.redlock_due
    if not conn.redlock_raw:
        return _take(conn, call, _read_via_redis(conn))
    try:
        data = os.read(conn.redlock_fd, wire.READ_SIZE)  # (wire.receive, inline)
    except BlockingIOError:
        return False, None  # nothing there: a spurious wake-up
    if not data:
        raise RedisConnectionError("the master closed the connection")
    buffer = conn.redlock_buffer + data if conn.redlock_buffer else data
    found: tuple[bool, Any] = (False, None)
    pos, size = 0, len(buffer)
    while pos < size:
        if not due:
            raise StaleReply(f"a reply nobody asked for: {buffer[pos:]!r:.200}")
        owed = due[0][0]
        payload, end = wire.next_reply(owed, buffer, pos)
        if end < 0:
            break  # the rest is on its way
        pos = end
        if payload.__class__ is int and owed is call:
            del due[0]
            found = (True, payload)
        else:
            found = _settle(conn, call, payload) or found
    conn.redlock_buffer = buffer[pos:] if pos < size else b""
    return found


def _take(conn: Any, call: Call | None, reply: Any) -> tuple[bool, Any]:
    if not conn.redlock_due:
        raise StaleReply(f"a reply nobody asked for: {reply!r:.200}")
    return _settle(conn, call, conn.redlock_due[0][0].payload(reply)) or (False, None)


def _settle(conn: Any, call: Call | None, payload: Any) -> tuple[bool, Any] | None:
    """The oldest due reply's ``payload`` is in: drop it from what is due; ``(True,
    payload)`` when it is ``call``'s. A NOSCRIPT (the script did not run) sends the
    script itself, due again."""
    owed, _, packed = conn.redlock_due.pop(0)
    if isinstance(payload, NoScriptError):
        _send(conn, owed.with_text(packed))
        conn.redlock_due.append((owed, time.monotonic() + IO_TIMEOUT, packed))
        return None
    if owed is call:
        return True, payload
    if isinstance(payload, Exception):
        log.debug("celery_redislock: an earlier Redlock request failed: %r", payload)
    return None


def _read_via_redis(conn: Any) -> Any:
    try:
        return conn.read_response()
    except NoScriptError as exc:
        return exc
    except RedisError as exc:
        if isinstance(exc, RedisTimeoutError) or conn._sock is None:
            raise
        return exc  # an error reply (a script error): the connection is clean


def _catch_up(conn: Any, label: str) -> None:
    """Before a new request: read the replies ``conn`` owes that are there already;
    wait for the oldest while it owes :data:`MAX_DUE` (a master far behind slows its
    client down rather than getting an ever longer queue); raise ``TimeoutError``
    when the oldest is overdue."""
    due = conn.redlock_due
    if not wire.is_raw(conn):
        return  # redis-py's connections owe nothing between rounds
    while due:
        before = len(due)
        _receive(conn, None)
        if len(due) == before:
            break  # nothing more there yet
    while due and (len(due) >= MAX_DUE or due[0][1] <= time.monotonic()):
        left = due[0][1] - time.monotonic()
        if left <= 0 or not select.select([conn._sock.fileno()], [], [], left)[0]:
            raise RedisTimeoutError(
                f"{label} did not answer an earlier request within its deadline"
            )
        _receive(conn, None)


def _send(conn: Any, data: bytes) -> None:
    if wire.is_raw(conn):
        wire.write(conn, data)
    else:
        conn.send_packed_command([data], check_health=False)


def _failed(conn: Any, exc: BaseException) -> BaseException:
    conn.disconnect()
    return exc
