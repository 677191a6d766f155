"""The Redlock masters' reply reader (core/redlock/wire.py): whole and partial replies
of every shape a script can give, errors as redis-py's exceptions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

from celery_redislock.core.lock_scripts import RELEASE
from celery_redislock.core.redlock.wire import Call, parse, reply_of


@pytest.mark.parametrize(("data", "value"), [
    (b":1795599415223395\r\n", 1795599415223395),
    (b"*2\r\n$9\r\na41b23468\r\n:17\r\n", [b"a41b23468", 17]),
    (b"*2\r\n$9\r\nr41b23468\r\n*3\r\n:0\r\n:250\r\n$0\r\n\r\n",
     [b"r41b23468", [0, 250, b""]]),
    (b"$-1\r\n", None),
    (b"_\r\n", None),
    (b"*-1\r\n", None),
    (b"+OK\r\n", b"OK"),
    (b"#t\r\n", True),
    (b",1.5\r\n", 1.5),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),
])  # fmt: skip
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
    conn = SimpleNamespace(redlock_buffer=b"")
    assert reply_of(call, conn, b"*2\r\n$9\r\nr41b23468\r\n:1\r\n") == 1
    fence = b"*2\r\n$9\r\nr41b23468\r\n:1795599415223395\r\n"
    assert reply_of(call, conn, fence) == 1795599415223395
    for other in (
        b"*2\r\n$9\r\nr41b23468\r\n:1\r\n*2\r\n$9\r\nr41b23468\r\n:1\r\n",  # two replies
        b"*2\r\n$9\r\nr41b23468\r\n*3\r\n:0\r\n:5\r\n$0\r\n\r\n",  # a refusal's array
        b"*2\r\n$9\r\nrXXXXXXXX\r\n:1\r\n",  # another call's stamp
        b"*2\r\n$9\r\nr41b23468\r\n:-1\r\n",
        b"*2\r\n$9\r\nr41b23468\r\n:1",  # not all there
    ):
        assert reply_of(call, conn, other) is None, other
    conn.redlock_buffer = b"*2\r\n"  # the rest of an earlier reply: the parser reads it
    assert reply_of(call, conn, b"*2\r\n$9\r\nr41b23468\r\n:1\r\n") is None
