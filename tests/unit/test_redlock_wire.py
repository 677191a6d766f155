"""The Redlock masters' reply reader (core/redlock/wire.py): whole and partial replies
of every shape a script can give, errors as redis-py's exceptions."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

from celery_redislock.core.lock_scripts import ACQUIRE, RELEASE
from celery_redislock.core.redlock import fanout
from celery_redislock.core.redlock.prepared import Prepared
from celery_redislock.core.redlock.wire import Call, next_reply, parse
from celery_redislock.core.scripts import StaleReply


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b":1795599415223395\r\n", 1795599415223395),
        (b"*2\r\n$9\r\na41b23468\r\n:17\r\n", [b"a41b23468", 17]),
        (b"*2\r\n$9\r\nr41b23468\r\n*3\r\n:0\r\n:250\r\n$0\r\n\r\n", [b"r41b23468", [0, 250, b""]]),
        (b"$-1\r\n", None),
        (b"_\r\n", None),
        (b"*-1\r\n", None),
        (b"+OK\r\n", b"OK"),
        (b"#t\r\n", True),
        (b",1.5\r\n", 1.5),
        (b"$4\r\na\r\nb\r\n", b"a\r\nb"),
    ],
)
def test_each_shape_is_read_whole_and_waits_for_its_rest(data: bytes, value: object) -> None:
    assert parse(data + b":7\r\n", 0) == (value, len(data))
    for cut in range(len(data)):
        assert parse(data[:cut], 0) == (None, -1), cut


def test_errors_are_redis_py_exceptions() -> None:
    error, end = parse(b"-NOSCRIPT No matching script.\r\n", 0)
    assert isinstance(error, NoScriptError) and end == 31
    error, _ = parse(b"-ERR user_script:1: boom\r\n", 0)
    assert type(error) is ResponseError and "boom" in str(error)


def test_an_unknown_type_is_a_protocol_error() -> None:
    with pytest.raises(InvalidResponse):
        parse(b">2\r\n$7\r\nmessage\r\n:1\r\n", 0)


def test_the_commonest_reply_is_read_without_the_parser() -> None:
    call = Call(RELEASE, [b"k"], ["41b23468ffff"])
    one = b"*2\r\n$9\r\nr41b23468\r\n:1\r\n"
    assert next_reply(call, one, 0) == (1, len(one))
    assert next_reply(call, b"xx" + one + one, 2) == (1, 2 + len(one))  # the first of two
    fence = b"*2\r\n$9\r\nr41b23468\r\n:1795599415223395\r\n"
    assert next_reply(call, fence, 0) == (1795599415223395, len(fence))
    negative = b"*2\r\n$9\r\nr41b23468\r\n:-1\r\n"
    assert next_reply(call, negative, 0) == (-1, len(negative))
    refusal = b"*2\r\n$9\r\nr41b23468\r\n*3\r\n:0\r\n:5\r\n$0\r\n\r\n"  # the parser's
    assert next_reply(call, refusal, 0) == ([0, 5, b""], len(refusal))
    for cut in range(len(fence)):  # not all there
        assert next_reply(call, fence[:cut], 0) == (None, -1), cut
    with pytest.raises(StaleReply):  # another call's stamp
        next_reply(call, b"*2\r\n$9\r\nrXXXXXXXX\r\n:1\r\n", 0)


def test_prepared_requests_are_what_redis_py_would_send() -> None:
    keys = [b"h", b"f", b"q", b"a", b"s"]
    prepared = Prepared(keys, [b"h", b"q", b"a", b"s", b"f"], b"p:done:", "p:boot:", 9000)
    args = [10000, "", b"0", 1795599415223395, 9000]
    call, packed_for = prepared.acquire(b"t0k3n.ab", args)
    expected = pack_command("EVALSHA", ACQUIRE.sha, 6, *keys, "p:boot:RUN:9000", "t0k3n.ab", *args)
    assert packed_for(0, "RUN") == b"".join(expected)
    assert call.stamp == b"at0k3n.ab"
    release = prepared.release(b"t0k3n.ab", b"0")
    expected = pack_command(
        "EVALSHA", RELEASE.sha, 6, b"h", b"q", b"a", b"s", b"f", "p:done:t0k3n.ab", "t0k3n.ab", "0"
    )
    assert release.packed == b"".join(expected)
    assert Call(RELEASE, [b"h"], ["tok", 5]).packed == b"".join(
        pack_command("EVALSHA", RELEASE.sha, 1, b"h", "tok", 5)
    )
    text = release.with_text(release.packed)
    assert text.startswith(b"*11\r\n$4\r\nEVAL\r\n") and text.endswith(release.packed[-40:])


def pack_command(*args: object) -> list[bytes]:
    return PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode).pack(*args)


def test_a_connection_reads_replies_split_across_reads_and_several_in_one() -> None:
    ours, server = socket.socketpair()
    ours.setblocking(False)
    conn = SimpleNamespace(
        redlock_fd=ours.fileno(), redlock_raw=True, redlock_buffer=b"", redlock_due=[], _sock=ours
    )
    first, second = (Call(RELEASE, [b"k"], [token]) for token in ("11111111x", "22222222x"))
    conn.redlock_due += [(first, 0.0, first.packed), (second, 0.0, second.packed)]
    one = b"*2\r\n$9\r\nr11111111\r\n:1\r\n"
    two = b"*2\r\n$9\r\nr22222222\r\n*3\r\n:0\r\n:5\r\n$0\r\n\r\n"
    try:
        server.send(one + two[:7])  # an earlier call's reply, and the start of this one's
        assert fanout._receive(conn, second) == (False, None)
        assert conn.redlock_due == [(second, 0.0, second.packed)]
        assert conn.redlock_buffer == two[:7]
        server.send(two[7:])
        assert fanout._receive(conn, second) == (True, [0, 5, b""])
        assert conn.redlock_due == [] and conn.redlock_buffer == b""
        assert fanout._receive(conn, None) == (False, None)  # nothing there
        # NOSCRIPT: the same request sent again as EVAL with the script's text.
        conn.redlock_due.append((first, 0.0, first.packed))
        server.send(b"-NOSCRIPT No matching script.\r\n")
        assert fanout._receive(conn, first) == (False, None)
        assert conn.redlock_due[0][0] is first
        sent = server.recv(65536)
        assert sent.startswith(b"*5\r\n$4\r\nEVAL\r\n") and sent.endswith(first.packed[-30:])
        server.send(one)
        assert fanout._receive(conn, first) == (True, 1)
        server.send(one)  # a reply nobody asked for
        with pytest.raises(StaleReply):
            fanout._receive(conn, None)
    finally:
        ours.close()
        server.close()
