"""The sync script calls pack EVALSHA themselves, byte for byte what redis-py would
send."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

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
