"""A reply taken straight off the stream buffer (asyncio/replies.py) is the value
redis-py's own parser returns (RESP2 and RESP3, decoded or not); anything else is
left in the buffer for redis-py's parser; and script calls over real connections of
either protocol and decoding read so."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis._parsers import _AsyncRESP2Parser, _AsyncRESP3Parser
from redis._parsers.encoders import Encoder

from celery_redislock.asyncio import replies
from celery_redislock.asyncio.semaphore import AsyncRedisSemaphore

OURS = [
    b":42\r\n",
    b":-7\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"+OK\r\n",
    b"_\r\n",
    b"*0\r\n",
    b"*-1\r\n",
    b"*2\r\n$9\r\nRabcdefgh\r\n*2\r\n:1\r\n$12\r\ntok.abc 1234\r\n",
    b"*3\r\n$5\r\n\xc3\xa9t\xc3\xa9\r\n*1\r\n*1\r\n:0\r\n$4\r\na\r\nb\r\n",
]
FOREIGN = [
    b"-NOSCRIPT No matching script\r\n",
    b"%1\r\n+a\r\n:1\r\n",
    b",1.5\r\n",
    b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n",
    b"*2\r\n:1\r\n,2.5\r\n",
]


def _parser(kind: type, reader: asyncio.StreamReader, decode: bool) -> Any:
    parser = kind(65536)
    parser._stream = reader
    parser.encoder = Encoder("utf-8", "strict", decode)
    parser._connected = True
    return parser


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    return reader


@pytest.mark.parametrize("kind", [_AsyncRESP2Parser, _AsyncRESP3Parser])
@pytest.mark.parametrize("decode", [False, True])
def test_a_buffered_reply_is_what_redis_py_reads(kind: type, decode: bool) -> None:
    async def main() -> None:
        for raw in OURS:
            if raw in ((b"$-1\r\n", b"*-1\r\n") if kind is _AsyncRESP3Parser else (b"_\r\n",)):
                continue  # RESP3's one null is "_", unknown to RESP2
            theirs = await _parser(kind, _reader(raw + b":9\r\n"), decode).read_response()
            reader = _reader(raw + b":9\r\n")
            parser = _parser(kind, reader, decode)
            assert replies.usable(parser, reader)
            assert await replies.read_buffered(parser, reader) == (theirs,), raw
            assert bytes(reader._buffer) == b":9\r\n"  # the next reply left as it was

    asyncio.run(main())


def test_other_kinds_are_left_whole_to_redis_py() -> None:
    async def main() -> None:
        for raw in FOREIGN:
            reader = _reader(raw)
            assert (
                await replies.read_buffered(_parser(_AsyncRESP3Parser, reader, False), reader)
                is None
            )
            assert bytes(reader._buffer) == raw

    asyncio.run(main())


def test_a_reply_arriving_in_parts_is_waited_for_once() -> None:
    async def main() -> None:
        raw = OURS[9]
        reader = _reader(raw[:7])
        parser = _parser(_AsyncRESP3Parser, reader, False)
        asyncio.get_running_loop().call_soon(reader.feed_data, raw[7:])
        whole = [b"Rabcdefgh", [1, b"tok.abc 1234"]]
        assert await replies.read_buffered(parser, reader) == (whole,)
        # Still partial after one wait: nothing taken, redis-py's parser reads it.
        reader = _reader(raw[:7])
        asyncio.get_running_loop().call_soon(reader.feed_data, raw[7:20])
        assert await replies.read_buffered(parser, reader) is None
        assert bytes(reader._buffer) == raw[:20]
        # A closed connection: left to the parser (which raises).
        reader = _reader(raw[:7])
        reader.feed_eof()
        assert await replies.read_buffered(parser, reader) is None

    asyncio.run(main())


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
def test_script_calls_over_either_protocol_and_decoding(
    redis_url: str, protocol: int, decode: bool
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
        sem = AsyncRedisSemaphore(client, f"replies-{protocol}-{decode}", limit=2, ttl=10)
        leases = await asyncio.gather(*(sem.acquire(blocking=False) for _ in range(5)))
        held = [lease for lease in leases if lease is not None]
        assert len(held) == 2 and held[0].fence != held[1].fence
        queued = asyncio.ensure_future(sem.acquire(timeout=5))
        while (await sem.info()).waiters < 1:
            await asyncio.sleep(0.01)
        assert all(await asyncio.gather(*(lease.release() for lease in held)))
        lease = await queued  # granted in a release's reply
        assert lease is not None and (await sem.info()).holders[0].fence == lease.fence
        assert await lease.release()
        await client.aclose()

    asyncio.run(main())


def _random_reply(rnd: random.Random, resp3: bool, depth: int = 0) -> bytes:
    """Any RESP value (errors and RESP3 types included, nested in arrays, maps, sets)."""
    kinds = ["int", "bulk", "simple", "null", "error", "not-utf8"] + (
        ["double", "bool", "big", "verbatim"] if resp3 else []
    )
    if depth < 3:
        kinds += ["array", "array"] + (["map", "set", "push"] if resp3 and depth == 0 else [])
    kind = rnd.choice(kinds)
    if kind == "int":
        return b":%d\r\n" % rnd.randint(-(10**20), 10**20)
    if kind == "bulk":
        text = bytes(rnd.choice(b"a\r\n\x00") for _ in range(rnd.choice([0, 1, 3, 70000])))
        return b"$%d\r\n%s\r\n" % (len(text), text)
    if kind == "simple":
        return b"+" + b"ok " * rnd.randint(0, 2) + b"\r\n"
    if kind == "null":
        return b"_\r\n" if resp3 else rnd.choice([b"$-1\r\n", b"*-1\r\n"])
    if kind == "error":
        return b"-ERR wrong\r\n"
    if kind == "not-utf8":
        return b"$2\r\n\xff\xfe\r\n"
    fixed = {
        "double": b",-1.5\r\n",
        "bool": b"#f\r\n",
        "big": b"(-12345678901234567890123\r\n",
        "verbatim": b"=7\r\ntxt:abc\r\n",
    }
    if kind in fixed:
        return fixed[kind]
    count = rnd.randint(0, 3)
    parts = count * (2 if kind == "map" else 1)
    body = b"".join(_random_reply(rnd, resp3, depth + 1) for _ in range(parts))
    if kind == "push":  # a push message, then the reply it came before
        return b">%d\r\n%s" % (count, body) + _random_reply(rnd, resp3, depth + 1)
    return {"array": b"*", "map": b"%", "set": b"~"}[kind] + b"%d\r\n" % count + body


def _plain(value: Any) -> Any:
    if isinstance(value, Exception):
        return (type(value).__name__, str(value))
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return [(repr(_plain(key)), _plain(item)) for key, item in value.items()]
    return value


async def _replies(kind: type, raw: bytes, decode: bool, cuts: list[int] | None) -> list[Any]:
    """Two replies (or the error ending them) as redis-py reads ``raw`` alone, or (cuts
    given) as wire.read does, ``raw`` arriving in parts cut at ``cuts``."""
    reader = asyncio.StreamReader()
    parser = _parser(kind, reader, decode)
    loop = asyncio.get_running_loop()
    ends = [0, *(cuts or []), len(raw)]
    parts = [raw[a:b] for a, b in itertools.pairwise(ends)]
    reader.feed_data(parts[0])
    for i, part in enumerate(parts[1:], 1):
        loop.call_later(0.0005 * i, reader.feed_data, part)
    loop.call_later(0.0005 * len(parts), reader.feed_eof)
    out: list[Any] = []
    for _ in range(2):
        try:
            got = None
            if cuts is not None and replies.usable(parser, reader):
                got = await replies.read_buffered(parser, reader)
            out.append(_plain(await parser.read_response() if got is None else got[0]))
        except Exception as exc:  # compared with redis-py's own
            out.append(type(exc).__name__)
            break
    await asyncio.sleep(0.0005 * (len(parts) + 1))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_any_reply_in_any_parts_reads_as_redis_py_reads_it(seed: int) -> None:
    """Adversarial buffers: random nested replies of every RESP2/RESP3 type (errors
    inside arrays, pushes, non-UTF-8 strings decoded, 70 kB bulk strings), cut at
    random points, read through replies.read_buffered then redis-py's parser as
    wire.read does: the same values (or errors) as redis-py's parser alone reads."""
    rnd = random.Random(seed)

    async def main() -> None:
        for _ in range(150):
            resp3 = rnd.random() < 0.5
            kind = _AsyncRESP3Parser if resp3 else _AsyncRESP2Parser
            decode = rnd.random() < 0.5
            raw = _random_reply(rnd, resp3) + _random_reply(rnd, resp3)
            cuts = sorted({rnd.randint(1, len(raw) - 1) for _ in range(rnd.randint(1, 3))})
            theirs = await _replies(kind, raw, decode, None)
            assert await _replies(kind, raw, decode, cuts) == theirs, (raw[:300], cuts)

    asyncio.run(main())
