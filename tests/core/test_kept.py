"""A thread keeps one connection per client for its script calls (core/kept.py)."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import RedisLock
from celery_redislock.core import kept as kept_module


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 0))  # no re-send to hide behind
    yield c
    c.close()


def cycle(client: redis.Redis, name: str = "job") -> None:
    with RedisLock(client, name, ttl=10):
        pass


def this_threads(client: redis.Redis) -> kept_module.Kept:
    state = kept_module._CLIENTS[id(client)]
    assert state is not None
    kept: kept_module.Kept = state.local.kept
    return kept


def test_a_thread_uses_one_connection_for_its_script_calls(client: redis.Redis) -> None:
    cycle(client)
    conn = this_threads(client).conn
    for i in range(5):
        cycle(client, f"job{i}")
    assert this_threads(client).conn is conn and not this_threads(client).busy
    pool = client.connection_pool
    assert conn in pool._in_use_connections  # type: ignore[attr-defined]
    client.set("plain", "1")  # other commands still go through the pool
    assert client.get("plain") == b"1"


def test_a_finished_thread_gives_its_connection_back(client: redis.Redis) -> None:
    taken: list[object] = []

    def work() -> None:
        cycle(client)
        taken.append(this_threads(client).conn)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    del thread
    gc.collect()
    pool = client.connection_pool
    assert taken and taken[0] not in pool._in_use_connections  # type: ignore[attr-defined]
    assert taken[0] in pool._available_connections  # type: ignore[attr-defined]
    state = kept_module._CLIENTS[id(client)]
    assert state is not None and state.count == 0


def test_at_most_a_quarter_of_the_pool_is_kept(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, max_connections=8)
    go, done = threading.Barrier(5), threading.Event()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            cycle(client, f"job{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        go.wait(10)
        done.wait(10)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    go.wait(10)
    state = kept_module._CLIENTS[id(client)]
    assert not errors and state is not None and state.count == 2  # 8 // 4; the rest pooled
    done.set()
    for thread in threads:
        thread.join()
    client.close()


def test_a_blocking_pool_is_not_kept_from(redis_url: str) -> None:
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_url))
    cycle(client)
    assert kept_module._CLIENTS[id(client)] is None
    client.close()


def test_a_connection_the_server_closed_while_idle_is_checked(
    client: redis.Redis, r: redis.Redis
) -> None:
    cycle(client)
    kept = this_threads(client)
    kept.conn.send_command("CLIENT", "ID")
    r.client_kill_filter(_id=kept.conn.read_response())
    kept.used -= kept_module.IDLE_CHECK + 1  # idle for long enough to be checked
    cycle(client)  # no retries configured: a dead socket would fail the call


def test_a_nested_call_takes_a_pooled_connection(client: redis.Redis) -> None:
    cycle(client)
    kept = this_threads(client)
    kept.busy = True  # as inside a call interrupted by a signal handler that locks
    try:
        cycle(client, "other")
    finally:
        kept.busy = False
    assert this_threads(client) is kept


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_takes_its_own_connection(client: redis.Redis) -> None:
    cycle(client)
    parent = this_threads(client).conn
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the parent's socket untouched
        code = 1
        try:
            cycle(client, "child")
            code = 0 if this_threads(client).conn is not parent else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    cycle(client)  # the parent's connection still works
    assert this_threads(client).conn is parent


def test_a_connection_closed_while_kept_is_used_again_once(
    client: redis.Redis, r: redis.Redis
) -> None:
    # Closed within the idle check's second (a restart, CLIENT KILL): the call is sent
    # once more on a new connection, as the pool would have reconnected it before the
    # send -- every script answers a re-send as its first execution.
    cycle(client)
    kept = this_threads(client)
    kept.conn.send_command("CLIENT", "ID")
    r.client_kill_filter(_id=kept.conn.read_response())
    cycle(client)
    assert this_threads(client) is kept
