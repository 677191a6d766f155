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
from collections.abc import Callable, Sequence
from typing import Any

from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from ..scripts import LuaScript, StaleReply

__all__ = ["Call", "is_raw", "parse", "receive", "replies_in", "reply_of", "reset", "write"]

_READ_SIZE = 16384


class Call:
    """One master's request: the script, its KEYS and its ARGV, packed once (the
    same bytes go to every master that gets the same request)."""

    __slots__ = ("args", "keys", "packed", "prefix", "script", "stamp")

    def __init__(self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Any],
                 packed: bytes | None = None) -> None:  # fmt: skip
        self.script = script
        self.keys = keys
        self.args = [_bytes(arg) for arg in args]
        self.packed = packed if packed is not None else _resp(
            [b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *keys, *self.args])
        self.stamp = _stamp(script, self.args)
        self.prefix = _prefix(self.stamp)

    @classmethod
    def family(cls, script: LuaScript, keys: Sequence[bytes],
               args: Sequence[Any]) -> Callable[[bytes], Call]:  # fmt: skip
        """A maker of the calls that differ only by one more, last key (a master's
        own): everything else is packed once."""
        encoded = [_bytes(arg) for arg in args]
        count = 3 + len(keys) + 1 + len(encoded)
        head = b"*%d\r\n" % count + _resp(
            [b"EVALSHA", script.sha.encode(), b"%d" % (len(keys) + 1), *keys], header=False)
        tail = _resp(encoded, header=False)
        stamp = _stamp(script, encoded)
        prefix = _prefix(stamp)
        new = cls.__new__

        def make(last: bytes) -> Call:
            call = new(cls)
            call.script, call.keys, call.args, call.stamp = script, [*keys, last], encoded, stamp
            call.prefix = prefix
            call.packed = head + b"$%d\r\n%s\r\n" % (len(last), last) + tail
            return call

        return make

    def with_text(self) -> bytes:
        """The same request as ``EVAL`` with the script's text (after NOSCRIPT)."""
        return _resp([b"EVAL", self.script.text.encode(), b"%d" % len(self.keys),
                      *self.keys, *self.args])  # fmt: skip

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


def _stamp(script: LuaScript, args: list[bytes]) -> bytes | None:
    # The stamp a stamped script's reply carries (see LuaScript.checked): its code and
    # the first 8 bytes of the first argument as sent.
    return script._code + (args[0][:8] if args else b"") if script.code else None


def _prefix(stamp: bytes | None) -> bytes | None:
    # The bytes before the integer of a stamped reply {stamp, integer}.
    return None if stamp is None else b"*2\r\n$%d\r\n%s\r\n:" % (len(stamp), stamp)


def _resp(parts: Sequence[bytes], header: bool = True) -> bytes:
    # RESP, as redis-py's packer writes it, without its per-argument encoder calls
    # (measured: half the client CPU of a fan-out).
    body = b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)
    return b"*%d\r\n" % len(parts) + body if header else body


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    raise TypeError(f"cannot send {value!r} to Redis")


def reset(conn: Any) -> None:
    """Fresh per-connection state (on every connect): no reply due, nothing buffered;
    whether its socket is read here (a plain socket) or by redis-py (TLS)."""
    conn.redlock_due = []  # [(Call, sent at)], oldest first
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
        data = os.read(conn.redlock_fd, _READ_SIZE)
    except BlockingIOError:
        return None
    if not data:
        raise RedisConnectionError("the master closed the connection")
    return data


def reply_of(call: Call, conn: Any, data: bytes) -> int | None:
    """The payload of the commonest reply, ``{stamp, integer}`` (a fence, a 1), when
    ``data`` is exactly that reply to ``call`` and nothing else is due before it or
    buffered: read without the general parser. None: parse ``data`` in full."""
    prefix = call.prefix
    if prefix is None or conn.redlock_buffer or not data.startswith(prefix) or \
            data[-2:] != b"\r\n":  # fmt: skip
        return None
    digits = data[len(prefix) : -2]
    return int(digits) if digits.isdigit() else None


def replies_in(conn: Any, data: bytes) -> list[Any]:
    """The complete replies in what was buffered and ``data`` (maybe none: the rest
    of a reply is awaited); a partial one stays buffered."""
    buffer = conn.redlock_buffer + data if conn.redlock_buffer else data
    replies = []
    pos = 0
    while pos < len(buffer):
        reply, end = parse(buffer, pos)
        if end < 0:
            break
        replies.append(reply)
        pos = end
    conn.redlock_buffer = buffer[pos:]
    return replies


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
