"""A script's reply read straight from a connection's stream buffer (used by
:func:`.wire.read`): the same value redis-py's own pure-Python parser returns, for
about a fifth of its time.

redis-py's parser awaits a line read for every element of a reply (a script's reply
``[stamp, [released, grants]]`` is five) and builds it through the parser's own
buffer; a burst's replies (:mod:`.batch`) arrive together, and parsing them was a
large part of the client's time per section. Here a reply whole in the buffer is
parsed in one pass and its bytes taken off the buffer, as ``readexactly`` would.

Only what scripts answer is read here: arrays, bulk and simple strings, integers and
nulls (RESP2 and RESP3), decoded as redis-py decodes them (``decode_responses``).
Anything else -- an error reply, a push message, a RESP3 map or double, a reply not
whole after one wait for data, a connection closed or failed -- is left to redis-py's
parser, untouched. It applies only to redis-py's pure-Python parsers with nothing of
their own buffered, over an ``asyncio.StreamReader`` (:func:`usable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["FOREIGN", "PARTIAL", "parse", "read_buffered", "usable"]

try:  # redis-py's own parsers (private names: a redis-py without them reads alone)
    from redis._parsers import _AsyncRESP2Parser, _AsyncRESP3Parser

    _PARSERS: tuple[type, ...] = (_AsyncRESP2Parser, _AsyncRESP3Parser)
except ImportError:  # pragma: no cover
    _PARSERS = ()
PARTIAL: Any = object()  # parse()'s answer when the reply is not whole in the buffer yet
FOREIGN: Any = object()  # ... when it is of a kind left to redis-py's parser

_STAR, _DOLLAR, _COLON, _PLUS, _UNDERSCORE = b"*$:+_"


def usable(parser: Any, reader: Any) -> bool:
    """True when a reply may be taken from ``reader`` instead of read by ``parser``:
    one of redis-py's Python parsers holding no bytes of its own, over a stream
    reader with the buffer this module reads (asyncio's)."""
    return (
        parser.__class__ in _PARSERS
        and not getattr(parser, "_buffer", True)  # absent: not the parser known here
        and not getattr(parser, "_chunks", True)
        and reader.__class__ is asyncio.StreamReader
    )


def parse(buf: bytearray, pos: int, decode: Callable[[bytes], Any] | None) -> Any:
    """``(value, end)`` of the reply at ``buf[pos:]`` (``end``: where it stops),
    :data:`PARTIAL` when it is not whole there, :data:`FOREIGN` when it is of a kind
    left to redis-py's parser; ``decode``: applied to each string (None: bytes kept)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return PARTIAL
    kind = buf[pos]
    if kind == _DOLLAR:
        size = int(buf[pos + 1 : end])
        start = end + 2
        if size < 0:
            return None, start
        stop = start + size
        if len(buf) < stop + 2:
            return PARTIAL
        value = bytes(buf[start:stop])
        return (value if decode is None else decode(value)), stop + 2
    if kind == _COLON:
        return int(buf[pos + 1 : end]), end + 2
    if kind == _STAR:
        count = int(buf[pos + 1 : end])
        pos = end + 2
        if count < 0:
            return None, pos
        items: list[Any] = []
        for _ in range(count):
            got = parse(buf, pos, decode)
            if got is PARTIAL or got is FOREIGN:
                return got
            items.append(got[0])
            pos = got[1]
        return items, pos
    if kind == _PLUS:
        value = bytes(buf[pos + 1 : end])
        return (value if decode is None else decode(value)), end + 2
    if kind == _UNDERSCORE:
        return None, end + 2
    return FOREIGN


async def read_buffered(parser: Any, reader: asyncio.StreamReader) -> Any:
    """``(reply,)`` taken off ``reader``'s buffer once whole there (waiting for data
    once if needed), or None: then nothing was taken, and redis-py's parser reads it
    (see the module docs; ``usable`` must hold)."""
    encoder = parser.encoder
    decode = encoder.decode if encoder is not None and encoder.decode_responses else None
    for wait in (True, False):
        buf = reader._buffer  # type: ignore[attr-defined]
        got = PARTIAL
        if buf:
            try:
                got = parse(buf, 0, decode)
            except ValueError:  # not a number where one belongs: the parser says so
                return None
            if got is FOREIGN:
                return None
            if got is not PARTIAL:
                del buf[: got[1]]
                reader._maybe_resume_transport()  # type: ignore[attr-defined]
                return (got[0],)
        if not wait or reader._eof or reader.exception() is not None:  # type: ignore[attr-defined]
            return None
        await reader._wait_for_data("read_buffered")  # type: ignore[attr-defined]
    return None
