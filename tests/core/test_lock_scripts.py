"""The lock's Lua scripts called directly: idempotency, NOSCRIPT, key names and slots."""

from __future__ import annotations

import re
import threading
import time
from importlib import resources
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.core import lock_scripts as lock_module
from celery_redislock.core.parking import PARKING_CONSTANTS
from celery_redislock.core.scripts import LuaScript
from celery_redislock.core.waiting import WAITER_HEARTBEAT_MS
from celery_redislock.testing import RedisServer

NAME = "job"


@pytest.fixture
def lock(r: redis.Redis) -> RedisLock:
    return RedisLock(r, NAME, ttl=30)


def acquire_call(
    lock: RedisLock, token: str, wait: str = "0", owner: str = "", ttl_ms: int = 30_000
) -> tuple[list[str], list[Any]]:
    keys = lock.keys
    return (
        [keys.holders, keys.fence, keys.queue, keys.alive, keys.asks],
        [token, ttl_ms, owner, wait],
    )


def release_call(lock: RedisLock, token: str) -> tuple[list[str], list[Any]]:
    keys = lock.keys
    return [keys.holders, keys.queue, keys.alive, keys.asks, keys.fence, keys.done(token)], [token]


def acquire(r: redis.Redis, lock: RedisLock, token: str, **options: Any) -> list[int]:
    """lock_acquire.lua's reply, a new lease's bare fence shown as [1, fence, ttl_ms]."""
    reply = lock_module.ACQUIRE(r, *acquire_call(lock, token, **options))
    if isinstance(reply, int):
        return [1, reply, options.get("ttl_ms", 30_000)]
    return list(reply)


def snapshot(r: redis.Redis, lock: RedisLock) -> tuple[Any, ...]:
    keys = lock.keys
    return (
        r.hgetall(keys.holders),
        r.get(keys.fence),
        r.zrange(keys.queue, 0, -1, withscores=True),
        r.zrange(keys.alive, 0, -1),
    )


# -- idempotency under client retries ------------------------------------------------------


def test_resent_acquire_is_granted_with_the_same_fence(r: redis.Redis, lock: RedisLock) -> None:
    token = "a" * 32
    first = acquire(r, lock, token)
    state = snapshot(r, lock)
    again = acquire(r, lock, token)
    assert first[0] == 1 and again[:2] == first[:2]
    assert [f for f in r.hkeys(lock.keys.holders) if f.startswith(b"t:")] == [
        b"t:" + token.encode()
    ]
    assert snapshot(r, lock) == state  # the re-send granted nothing new
    # the same holds for a re-sent *queued* attempt that had been granted
    assert acquire(r, lock, token, wait="1")[:2] == first[:2]
    assert r.zcard(lock.keys.queue) == 0


def test_a_new_lease_is_answered_by_its_bare_fence(r: redis.Redis, lock: RedisLock) -> None:
    # The common reply is the cheapest one to build and parse: an integer, not an array.
    fresh = lock_module.ACQUIRE(r, *acquire_call(lock, "a" * 32, owner="o"))
    assert isinstance(fresh, int)
    reentered = lock_module.ACQUIRE(r, *acquire_call(lock, "b" * 32, owner="o"))
    assert isinstance(reentered, int) and reentered > fresh
    resent = lock_module.ACQUIRE(r, *acquire_call(lock, "b" * 32, owner="o"))
    assert resent[:2] == [1, reentered] and 29_000 < resent[2] <= 30_000
    refused = lock_module.ACQUIRE(r, *acquire_call(lock, "c" * 32))
    assert refused[0] == 0 and refused[2] == b"o"


def test_resent_reentrant_acquire_is_one_lease(r: redis.Redis, lock: RedisLock) -> None:
    acquire(r, lock, "a" * 32, owner="o")
    second = acquire(r, lock, "b" * 32, owner="o")
    again = acquire(r, lock, "b" * 32, owner="o")
    assert second[:2] == again[:2]
    assert len([f for f in r.hkeys(lock.keys.holders) if f.startswith(b"t:")]) == 2


def test_resent_release_changes_nothing(r: redis.Redis, lock: RedisLock) -> None:
    mine = "a" * 32
    acquire(r, lock, mine)
    assert lock_module.RELEASE(r, *release_call(lock, mine)) == 1
    assert lock_module.RELEASE(r, *release_call(lock, mine)) == 1  # answered as the first
    # ... also once someone else holds the lock: the re-send does not free it.
    theirs = "b" * 32
    assert acquire(r, lock, theirs)[0] == 1
    state = snapshot(r, lock)
    assert lock_module.RELEASE(r, *release_call(lock, mine)) == 1
    assert snapshot(r, lock) == state
    # ... and a re-sent acquire of the released token does not take it back.
    assert acquire(r, lock, mine)[0] == 0
    assert snapshot(r, lock)[0] == state[0]


def test_a_release_without_record_answers_its_resend_with_0(
    r: redis.Redis, lock: RedisLock
) -> None:
    # ARGV[2] "0" (a caller that judges re-sends itself): no record when nobody waits,
    # so a re-send finds the lease gone; with a waiter queued the record is written.
    keys, _ = release_call(lock, "a" * 32)
    acquire(r, lock, "a" * 32)
    assert lock_module.RELEASE(r, keys, ["a" * 32, "0"]) == 1
    assert not r.exists(keys[5]) and lock_module.RELEASE(r, keys, ["a" * 32, "0"]) == 0
    keys, _ = release_call(lock, "b" * 32)
    acquire(r, lock, "b" * 32)
    acquire(r, lock, "c" * 32, wait="1")
    assert lock_module.RELEASE(r, keys, ["b" * 32, "0"]) == 1
    assert r.exists(keys[5]) and lock_module.RELEASE(r, keys, ["b" * 32, "0"]) == 1


def test_resent_extend_is_harmless(r: redis.Redis, lock: RedisLock) -> None:
    token = "a" * 32
    acquire(r, lock, token, ttl_ms=1000)
    for _ in range(2):
        assert lock_module.EXTEND(r, [lock.keys.holders], [token, 5000]) == 1
        assert 4900 < r.pttl(lock.keys.holders) <= 5000
    assert lock_module.EXTEND(r, [lock.keys.holders], ["b" * 32, 5000]) == 0


def test_refused_acquire_reports_the_ttl_left(r: redis.Redis, lock: RedisLock) -> None:
    acquire(r, lock, "a" * 32, ttl_ms=2000)
    refused = acquire(r, lock, "b" * 32)
    assert refused[0] == 0 and 1900 < refused[1] <= 2000


def test_queued_attempt_keeps_one_ticket(r: redis.Redis, lock: RedisLock) -> None:
    acquire(r, lock, "a" * 32)
    for _ in range(3):
        acquire(r, lock, "b" * 32, wait="1")
    acquire(r, lock, "c" * 32, wait="1")
    queue = r.zrange(lock.keys.queue, 0, -1, withscores=True)
    assert [member for member, _ in queue] == [b"b" * 32, b"c" * 32]
    assert queue[0][1] < queue[1][1]
    for key in (lock.keys.queue, lock.keys.alive, lock.keys.asks):  # dead waiters expire
        assert 2 * WAITER_HEARTBEAT_MS - 1000 <= r.pttl(key) <= 2 * WAITER_HEARTBEAT_MS
    assert r.hgetall(lock.keys.asks) == {b"b" * 32: b"30000 ", b"c" * 32: b"30000 "}
    # A heartbeat refreshes the keys' TTL once it has run down by a second or more.
    for key in (lock.keys.queue, lock.keys.alive, lock.keys.asks):
        r.pexpire(key, 3000)
    acquire(r, lock, "c" * 32, wait="1")
    for key in (lock.keys.queue, lock.keys.alive, lock.keys.asks):
        assert r.pttl(key) > 2 * WAITER_HEARTBEAT_MS - 1000


def test_release_grants_the_lock_to_the_head_and_tells_it(r: redis.Redis, lock: RedisLock) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(lock.keys.channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    first = acquire(r, lock, "a" * 32)
    acquire(r, lock, "b" * 32, wait="1", owner="B", ttl_ms=7000)
    acquire(r, lock, "c" * 32, wait="1")
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1
    message = pubsub.get_message(timeout=2)
    assert message is not None
    token, fence = message["data"].split()
    assert token == b"b" * 32 and int(fence) > first[1]
    # "b" holds the lock now, with the TTL and owner it asked for, and left the queue.
    held = r.hgetall(lock.keys.holders)
    assert held[b"owner"] == b"B" and int(held[b"f:" + b"b" * 32]) == int(fence)
    assert 6000 < r.pttl(lock.keys.holders) <= 7000
    assert r.zrange(lock.keys.queue, 0, -1) == [b"c" * 32]
    assert r.hkeys(lock.keys.asks) == [b"c" * 32]
    # Its own attempt (a lost message, a poll) finds the same grant, with the TTL it
    # has left (its local deadline must not count from this later request); nobody
    # else is told.
    time.sleep(0.3)
    again = acquire(r, lock, "b" * 32, wait="1", ttl_ms=7000)
    assert again[:2] == [1, int(fence)] and 6000 < again[2] <= 6750
    assert pubsub.get_message(timeout=0.1) is None
    pubsub.close()


def test_release_does_not_grant_a_waiter_nobody_listens_for(
    r: redis.Redis, lock: RedisLock
) -> None:
    # No subscriber on the waiter's channel (its process is gone, or, on a cluster, it
    # listens through another node): granting it would leave a lease nobody uses, and
    # announcing a grant that was not written would make two holders.
    acquire(r, lock, "a" * 32)
    acquire(r, lock, "b" * 32 + ".0badcafe", wait="1")
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1
    assert not lock.locked()
    assert r.zrange(lock.keys.queue, 0, -1) == [b"b" * 32 + b".0badcafe"]


def test_owner_reentering_while_queued_leaves_the_queue(r: redis.Redis, lock: RedisLock) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(lock.keys.channel)  # the waiters' process listens
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    acquire(r, lock, "a" * 32, owner="other")
    for token in ("h" * 32, "t" * 32):  # two waits of one owner (e.g. a task's retry)
        acquire(r, lock, token, wait="1", owner="o")
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1  # granted to "h"
    reentered = acquire(r, lock, "t" * 32, wait="1", owner="o")
    assert reentered[0] == 1
    # Out of the queue: a later release must not grant "t" a second, unused lease.
    assert r.zcard(lock.keys.queue) == 0 and r.hlen(lock.keys.asks) == 0
    for token in ("h" * 32, "t" * 32):
        assert lock_module.RELEASE(r, *release_call(lock, token)) == 1
    assert not lock.locked()
    pubsub.close()


def test_release_only_wakes_a_head_that_has_not_checked_in_lately(
    r: redis.Redis, lock: RedisLock
) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(lock.keys.channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    acquire(r, lock, "a" * 32)
    acquire(r, lock, "b" * 32, wait="1")
    # Its heartbeat deadline is under half a heartbeat away: it may be dead, so it is
    # not handed a lock it might never use; it is woken, and asks itself.
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    r.zadd(lock.keys.alive, {"b" * 32: now_ms + WAITER_HEARTBEAT_MS // 2 - 500})
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1
    message = pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"b" * 32
    assert not lock.locked()
    assert acquire(r, lock, "b" * 32, wait="1")[0] == 1
    pubsub.close()


def test_wake_up_of_a_tagged_token_goes_to_its_process_channel(
    r: redis.Redis, lock: RedisLock
) -> None:
    waiter = "b" * 32 + ".0badcafe"
    pubsub = r.pubsub()
    pubsub.subscribe(lock.keys.channel, f"{lock.keys.channel}:0badcafe")
    for _ in range(2):
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    acquire(r, lock, "a" * 32)
    acquire(r, lock, waiter, wait="1")
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1
    message = pubsub.get_message(timeout=2)
    assert message is not None
    assert message["channel"] == f"{lock.keys.channel}:0badcafe".encode()
    assert message["data"].split()[0] == waiter.encode()  # "<token> <fence>": granted
    assert pubsub.get_message(timeout=0.1) is None  # nothing on the shared channel
    pubsub.close()


@pytest.mark.parametrize("name", ["job", "a{b}c", "naïve ☃:holders"])
def test_scripts_publish_on_the_channel_keys_names(r: redis.Redis, name: str) -> None:
    # The scripts derive the wake-up channel from the holders key (wake_channel in
    # lib_lock.lua): a release hands over on exactly `KeySpace.channel:<tag>`, for a
    # lock and for a semaphore (had Lua derived another name, nobody would listen
    # there: the waiter would be woken on that other channel, not granted).
    primitives = (RedisLock(r, name, prefix="p:x"), RedisSemaphore(r, name, limit=1, prefix="p:x"))
    for primitive in primitives:
        pubsub = r.pubsub()  # type: ignore[no-untyped-call]
        pubsub.subscribe(f"{primitive.keys.channel}:0badcafe")
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"
        holder = primitive.acquire()
        assert holder is not None
        waiter = "w" * 32 + ".0badcafe"
        if isinstance(primitive, RedisLock):
            assert acquire(r, primitive, waiter, wait="1")[0] == 0
        else:
            assert primitive._attempt(waiter, "", 30_000, True)[0] == 0
        assert holder.release()
        message = pubsub.get_message(timeout=2)
        assert message is not None and message["type"] == "message"
        assert message["channel"] == f"{primitive.keys.channel}:0badcafe".encode()
        assert message["data"].decode().startswith(waiter + " ")  # granted to it
        pubsub.close()


def test_trailing_defaults_may_be_left_out(r: redis.Redis, lock: RedisLock) -> None:
    keys = acquire_call(lock, "a" * 32)[0]
    # token and ttl only: no owner, and a refusal does not queue.
    fence = lock_module.ACQUIRE(r, keys, ["a" * 32, 30_000])
    assert isinstance(fence, int)
    assert r.hget(lock.keys.holders, "owner") == b""
    refused = lock_module.ACQUIRE(r, keys, ["b" * 32, 30_000])
    assert refused[0] == 0 and not r.exists(lock.keys.queue)
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 1
    # An owner without the wait flag: re-entry counts, a refusal still does not queue.
    assert isinstance(lock_module.ACQUIRE(r, keys, ["c" * 32, 30_000, "o"]), int)
    assert isinstance(lock_module.ACQUIRE(r, keys, ["d" * 32, 30_000, "o"]), int)
    assert lock_module.ACQUIRE(r, keys, ["e" * 32, 30_000, "x"])[0] == 0
    assert not r.exists(lock.keys.queue)


def test_release_of_an_expired_lease_wakes_the_head(r: redis.Redis, lock: RedisLock) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(lock.keys.channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    acquire(r, lock, "a" * 32, ttl_ms=50)
    acquire(r, lock, "b" * 32, wait="1")
    time.sleep(0.08)  # "a" expired: the lock is free, and nobody told "b"
    state = snapshot(r, lock)
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 0
    message = pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"b" * 32
    assert snapshot(r, lock) == state  # a wake-up, no change
    # While someone else holds it, a stale release tells nobody anything.
    assert acquire(r, lock, "b" * 32, wait="1")[0] == 1
    assert lock_module.RELEASE(r, *release_call(lock, "a" * 32)) == 0
    assert pubsub.get_message(timeout=0.1) is None
    pubsub.close()


# -- NOSCRIPT --------------------------------------------------------------------------------


def test_scripts_run_by_evalsha() -> None:
    # A server of its own: the counts are server-wide, and background threads of
    # earlier tests in this process (renewal, give-back) may still call the session's.
    with RedisServer() as server, redis.Redis(port=server.port) as r:
        lock = RedisLock(r, "job", ttl=5)
        lease = lock.acquire()  # loads the scripts (after a NOSCRIPT each)
        assert lease is not None and lease.extend() and lease.release()
        r.config_resetstat()
        for _ in range(5):
            lease = lock.acquire()
            assert lease is not None
            assert lease.extend()
            assert lease.release()
        stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 15
    assert "cmdstat_eval" not in stats


def test_script_flush_between_operations_breaks_nothing(r: redis.Redis, lock: RedisLock) -> None:
    for _ in range(3):
        r.script_flush()
        lease = lock.acquire()
        assert lease is not None
        r.script_flush()
        assert lease.extend(10)
        r.script_flush()
        assert lock.info().held
        r.script_flush()
        assert lock.acquire(blocking=False) is None
        r.script_flush()
        assert lease.release()
        r.script_flush()
        assert not lock.locked()


@pytest.mark.parametrize(
    "filename",
    sorted(
        entry.name
        for entry in resources.files("celery_redislock.core.lua").iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("lib_")
    ),
)
def test_every_script_compiles_as_expanded(r: redis.Redis, filename: str) -> None:
    # SCRIPT LOAD compiles without running: a pruned helper or a constant left out
    # would show here as a syntax error (or an undefined name, below).
    # The park scripts take the parking constants (a superset of the lock's).
    constants = PARKING_CONSTANTS if filename.startswith("park") else lock_module.SCRIPT_CONSTANTS
    script = LuaScript(filename, constants)
    assert r.script_load(script.text) == script.sha
    defined = set(re.findall(r"^local function (\w+)\(", script.text, re.MULTILINE))
    code = re.sub(r"--[^\n]*|'[^'\n]*'", "", script.text)
    called = set(re.findall(r"(?<![.:\w])([a-z_]+)\(", code))
    builtins = {"tonumber", "ipairs", "pairs", "unpack", "function", "type"}
    assert called - defined <= builtins, filename


def test_noscript_falls_back_to_eval_once(r: redis.Redis) -> None:
    script = LuaScript("lock_info.lua")
    r.script_flush()
    assert r.script_exists(script.sha) == [False]
    script(r, ["{x}:holders", "{x}:queue"], ["nonce"])
    assert r.script_exists(script.sha) == [True]  # cached again by the EVAL


def test_script_flush_during_operations_breaks_nothing(r: redis.Redis, redis_url: str) -> None:
    stop = threading.Event()
    flushes = 0

    def flusher() -> None:
        nonlocal flushes
        client = redis.Redis.from_url(redis_url)
        while not stop.is_set():
            client.script_flush()
            flushes += 1
            time.sleep(0.001)
        client.close()

    errors: list[BaseException] = []
    sections = 0
    counter = "noscript:counter"

    def worker() -> None:
        nonlocal sections
        client = redis.Redis.from_url(redis_url)
        lock = RedisLock(client, "noscript", ttl=30)
        try:
            for _ in range(40):
                lease = lock.acquire(timeout=10)
                assert lease is not None
                value = int(client.get(counter) or 0)
                client.set(counter, value + 1)
                assert lease.extend()
                sections += 1
                assert lease.release()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            client.close()

    flush_thread = threading.Thread(target=flusher)
    flush_thread.start()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stop.set()
    flush_thread.join(10)
    assert not errors, errors
    assert sections == 160 and int(r.get(counter) or 0) == 160
    assert flushes > 10


# -- names with braces; one hash slot -------------------------------------------------------

AWKWARD = ["a{b}c", "}{", "%7B", "{", "}", "{}", "%", "x{y}z{w}", "naïve ☃"]


@pytest.mark.parametrize("name", AWKWARD)
def test_brace_names_work_and_every_key_shares_one_slot(r: redis.Redis, name: str) -> None:
    lock = RedisLock(r, name, ttl=30)
    assert lock.name == name
    lease = lock.acquire(owner="o")
    assert lease is not None
    assert lock.acquire(owner="o", blocking=False) is not None
    acquire(r, lock, "w" * 32, wait="1")  # a queued waiter
    info = lock.info()
    assert info.name == name and info.held and info.waiters == 1
    keys = r.keys("*")
    assert {lock.keys.holders, lock.keys.fence, lock.keys.queue, lock.keys.alive} <= {
        k.decode() for k in keys
    }
    assert len({key_slot(key) for key in keys}) == 1, keys  # every key the scripts made


def test_escaped_and_raw_braces_are_different_locks(r: redis.Redis) -> None:
    first = RedisLock(r, "{").acquire()
    second = RedisLock(r, "%7B").acquire(blocking=False)
    third = RedisLock(r, "%257B").acquire(blocking=False)
    assert first is not None and second is not None and third is not None
    assert len(r.keys("*:holders")) == 3
