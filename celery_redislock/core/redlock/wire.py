"""The bytes a Redlock master's connection carries: requests packed once, replies read
straight from the socket.

A Redlock operation costs one request per master, so the client's CPU per request
counts five times over. redis-py's connection is kept for what it does well (connect,
handshake, AUTH, TLS); on a plain TCP or Unix socket speaking RESP2 the requests are
written with one ``write`` and the replies read with one ``read`` and parsed here
(the scripts' replies are small arrays of integers and strings, the same bytes in
RESP2 and RESP3), about half the client CPU of ``send_packed_command`` and
``read_response``. A TLS connection goes through redis-py.

Replies may arrive for requests of an earlier round (a round ends once a majority
answered: see :func:`~.masters.fan_out`), so a connection keeps the calls whose
replies are still due, oldest first, and the bytes read but not yet parsed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from ..resp import pack_evalsha
from ..scripts import LuaScript, StaleReply

__all__ = ["Call", "bulks", "is_raw", "next_reply", "parse", "receive", "reset", "write"]

READ_SIZE = 16384
"""Most bytes one ``read`` takes from a master's socket."""


class Call:
    """One request's reply check: the script and the stamp its reply must carry, and
    the request packed (the same bytes for every master that gets the same request;
    a request that differs by master is packed by the caller, see
    :class:`~.prepared.Prepared`)."""

    __slots__ = ("packed", "prefix", "script", "stamp")

    def __init__(
        self,
        script: LuaScript,
        keys: Sequence[bytes],
        args: Sequence[Any],
        packed: bytes | None = None,
    ) -> None:
        self.script = script
        first = _bytes(args[0]) if args else b""
        self.packed = (
            packed if packed is not None else pack_evalsha(script.head, keys, args, _bytes)
        )
        self.stamp, self.prefix = _check(script, first)

    @classmethod
    def stamped(cls, script: LuaScript, first: bytes, packed: bytes = b"") -> Call:
        """The check of a request packed by the caller, whose first argument is
        ``first`` (a stamped script's reply carries its first 8 bytes)."""
        call = cls.__new__(cls)
        call.script, call.packed = script, packed
        call.stamp, call.prefix = _check(script, first)
        return call

    def with_text(self, packed: bytes) -> bytes:
        """``packed`` (this call's request to one master) as ``EVAL`` with the script's
        text (after NOSCRIPT): the same arguments after the script."""
        text = self.script.text.encode()
        return packed.replace(
            self.script.head, b"$4\r\nEVAL\r\n$%d\r\n%b\r\n" % (len(text), text), 1
        )

    def payload(self, reply: Any) -> Any:
        """The reply's payload when it is this call's; :class:`StaleReply` if not (an
        error reply is returned as is: the caller raises it)."""
        if self.stamp is None or isinstance(reply, Exception):
            return reply
        if reply.__class__ is list and len(reply) == 2:
            stamp = reply[0]
            if stamp.__class__ is not bytes:
                stamp = str(stamp).encode("utf-8")
            if stamp == self.stamp:
                return reply[1]
        raise StaleReply(f"{self.script.name}: the reply is not this call's: {reply!r:.200}")


def _check(script: LuaScript, first: bytes) -> tuple[bytes | None, bytes | None]:
    # The stamp a stamped script's reply carries (see LuaScript.checked: its code and
    # the first 8 bytes of the first argument as sent) and its reply's prefix.
    if not script.code:
        return None, None
    stamp = script._code + first[:8]
    return stamp, _prefix(stamp)


def _prefix(stamp: bytes) -> bytes:
    # The bytes before the integer of a stamped reply {stamp, integer}.
    return b"*2\r\n$%d\r\n%b\r\n:" % (len(stamp), stamp)


def bulks(parts: Sequence[Any]) -> bytes:
    """``parts`` as RESP bulk strings, no count line (a piece of a request packed
    once: see :class:`~.prepared.Prepared`); as :func:`~..resp.pack_evalsha` packs
    its arguments."""
    return b"".join(b"$%d\r\n%b\r\n" % (len(part), part) for part in map(_bytes, parts))


def _bytes(value: Any) -> bytes:
    if value.__class__ is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    raise TypeError(f"cannot send {value!r} to Redis")


def reset(conn: Any) -> None:
    """Fresh per-connection state (on every connect): no reply due, nothing buffered;
    whether its socket is read here (a plain socket) or by redis-py (TLS)."""
    conn.redlock_due = []  # [(Call, expires, request sent)], oldest first
    conn.redlock_buffer = b""
    sock = conn._sock
    conn.redlock_fd = sock.fileno()
    conn.redlock_raw = type(sock) is socket.socket


def is_raw(conn: Any) -> bool:
    """True when this module reads and writes ``conn``'s socket itself."""
    return bool(getattr(conn, "redlock_raw", False))


def write(conn: Any, data: bytes) -> None:
    """Send ``data`` on a raw connection: one ``write`` (the socket is non-blocking:
    redis-py gives it a timeout); the rest, if any, with the socket's own timeout."""
    try:
        sent = os.write(conn.redlock_fd, data)
    except BlockingIOError:
        sent = 0
    if sent < len(data):
        conn._sock.sendall(data[sent:])


def receive(conn: Any) -> bytes | None:
    """What a raw connection has to read now (None: nothing, a spurious wake-up).
    Raises ``ConnectionError`` when the server closed it."""
    try:
        data = os.read(conn.redlock_fd, READ_SIZE)
    except BlockingIOError:
        return None
    if not data:
        raise RedisConnectionError("the master closed the connection")
    return data


def next_reply(call: Call, buffer: bytes, pos: int) -> tuple[Any, int]:
    """The reply to ``call`` at ``buffer[pos:]``: ``(payload, end)`` (see
    :meth:`Call.payload`; :class:`StaleReply` when it is not ``call``'s), or
    ``(None, -1)`` when it is not all there yet. The commonest reply, ``{stamp,
    integer}`` (a fence, a 1), is read without the general parser."""
    prefix = call.prefix
    if prefix is not None and buffer.startswith(prefix, pos):
        start = pos + len(prefix)
        end = buffer.find(b"\r\n", start)
        return (None, -1) if end < 0 else (int(buffer[start:end]), end + 2)
    reply, end = parse(buffer, pos)
    return (None, -1) if end < 0 else (call.payload(reply), end)


def parse(buffer: bytes, pos: int) -> tuple[Any, int]:
    """One reply from ``buffer[pos:]``: ``(value, end)``, or ``(None, -1)`` when it is
    not all there yet. An error reply is its redis-py exception (returned, not
    raised); bulk strings are bytes, as redis-py gives them without decoding. RESP2,
    and of RESP3 what a script's reply can be (null, boolean, double); any other type
    (a push message: never sent on these connections) is a protocol error."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        return None, -1
    kind = buffer[pos]
    if kind == 58:  # ":" integer
        return int(buffer[pos + 1 : end]), end + 2
    if kind == 36:  # "$" bulk string
        size = int(buffer[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if stop + 2 > len(buffer):
            return None, -1
        return buffer[end + 2 : stop], stop + 2
    if kind == 42:  # "*" array
        count = int(buffer[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items = []
        pos = end + 2
        for _ in range(count):
            item, pos = parse(buffer, pos)
            if pos < 0:
                return None, -1
            items.append(item)
        return items, pos
    if kind == 43:  # "+" simple string
        return buffer[pos + 1 : end], end + 2
    if kind == 95:  # "_" RESP3 null (a script's nil)
        return None, end + 2
    if kind == 35:  # "#" RESP3 boolean
        return buffer[pos + 1 : end] == b"t", end + 2
    if kind == 44:  # "," RESP3 double
        return float(buffer[pos + 1 : end]), end + 2
    if kind == 45:  # "-" error
        message = buffer[pos + 1 : end].decode("utf-8", "replace")
        error: Exception = BaseParser.parse_error(message)  # type: ignore[no-untyped-call]
        return error, end + 2
    raise InvalidResponse(f"Protocol error, got {chr(kind)!r} as reply type byte")
