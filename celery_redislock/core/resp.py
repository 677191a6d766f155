"""Script calls in the Redis protocol: one packer for the sync and the async calls.

Both the sync calls (:class:`.scripts.LuaScript`) and the async ones
(``celery_redislock.asyncio.calls``) write ``EVALSHA`` themselves, packed here exactly
as redis-py's ``pack_command`` would pack it (``tests/unit/test_async_packing.py``
compares them byte for byte), for about a third of its cost: redis-py runs its
encoder's type checks on every argument, and names and tokens are plain ``str``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["evalsha_head", "key_encoder", "pack_evalsha"]

_ENCODERS: dict[int, Callable[[Any], bytes]] = {}


def evalsha_head(sha: str) -> bytes:
    """``EVALSHA`` and the script's ``sha`` as two bulk strings: the fixed start of
    every call of that script, made once per script."""
    return b"$7\r\nEVALSHA\r\n$40\r\n" + sha.encode() + b"\r\n"


def pack_evalsha(
    head: bytes, keys: Sequence[Any], args: Sequence[Any], encode: Callable[[Any], bytes]
) -> bytes:
    """``EVALSHA <sha> <numkeys> *keys *args`` as one bytes string (``head``: from
    :func:`evalsha_head`). Bytes go as they are, an int as its digits, anything else
    through ``encode`` (the client's own, from :func:`key_encoder`)."""
    count = b"%d" % len(keys)
    parts = [b"*%d\r\n%b$%d\r\n%b\r\n" % (3 + len(keys) + len(args), head, len(count), count)]
    append = parts.append
    for value in (*keys, *args):
        if value.__class__ is not bytes:
            value = b"%d" % value if value.__class__ is int else encode(value)
        append(b"$%d\r\n%b\r\n" % (len(value), value))
    return b"".join(parts)


def key_encoder(client: Any) -> Callable[[Any], bytes]:
    """``client``'s own encoder (what redis-py sends for a str), made once per client:
    ``get_encoder()`` builds a new one from the pool's settings on every call, and
    locks are built per call (``with RedisLock(client, f"user:{uid}")``)."""
    encode = _ENCODERS.get(id(client))
    if encode is None:
        encoder = client.get_encoder()
        encode = _ENCODERS[id(client)] = _fast_encode(
            encoder.encode, encoder.encoding, encoder.encoding_errors
        )
        weakref.finalize(client, _ENCODERS.pop, id(client), None)
    return encode


def _fast_encode(
    encode: Callable[[Any], bytes], encoding: str, errors: str
) -> Callable[[Any], bytes]:
    """``encode`` (redis-py's ``Encoder.encode``), with a str encoded at once: names
    and tokens are str, and the encoder's type checks cost more than the encoding."""

    def fast(value: Any) -> bytes:
        if value.__class__ is str:
            return value.encode(encoding, errors)  # what Encoder.encode does for a str
        return encode(value)

    return fast
