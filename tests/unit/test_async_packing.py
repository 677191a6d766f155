"""The script calls (sync and async) pack EVALSHA themselves, byte for byte what
redis-py would send; the async ones write and read past redis-py only on its own
connection classes."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelManagedConnection

from celery_redislock.core.lock_scripts import ACQUIRE, RELEASE
from celery_redislock.core.resp import key_encoder, pack_evalsha


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        ([b"redislock:lock:{a}:holders", b"k:2"], ["tok.abc", 30_000, "ownér"]),
        ([], []),
        ([b"x"] * 12, [b"1", 2.5, -3, "", 10**20]),
        (["a-str-key"], [memoryview(b"mv")]),
    ],
)
def test_pack_evalsha_is_what_redis_py_sends(keys: list[Any], args: list[Any]) -> None:
    client = aioredis.Redis(encoding="latin-1")
    conn = Connection(encoding="latin-1")
    for script in (ACQUIRE, RELEASE):
        mine = pack_evalsha(script.head, keys, args, key_encoder(client))
        theirs = b"".join(conn.pack_command("EVALSHA", script.sha, len(keys), *keys, *args))
        assert mine == theirs


@pytest.mark.skipif(sys.version_info < (3, 11), reason="celery_redislock.asyncio needs 3.11+")
def test_the_shortcuts_are_taken_on_redis_py_s_own_connections_only() -> None:
    from celery_redislock.asyncio.wire import plain

    assert plain(Connection) and plain(SSLConnection) and plain(UnixDomainSocketConnection)
    # Sentinel's reads turn a demoted master's READONLY into a reconnect: kept.
    assert not plain(SentinelManagedConnection)
