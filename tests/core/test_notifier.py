"""The shared subscriber: one reader per client, gone once the client is idle or dropped."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import redis

from celery_redislock import RedisLock
from celery_redislock.core import waiting


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "celery-redislock-notifier"]


def _wait_once(client: redis.Redis, name: str) -> None:
    """Make one blocking acquire wait (so it subscribes), then let it through."""
    lock = RedisLock(client, name, ttl=5)
    holder = lock.acquire()
    assert holder is not None
    timer = threading.Timer(0.05, holder.release)
    timer.start()
    assert lock.acquire(timeout=5) is not None
    timer.join()


def test_idle_reader_ends_and_comes_back(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "IDLE_UNSUBSCRIBE", 0.1)
    monkeypatch.setattr(waiting, "IDLE_STOP", 0.3)
    client = redis.Redis.from_url(redis_url)
    _wait_once(client, "notifier-a")
    reader = waiting.Notifier.for_client(client)._reader
    assert reader is not None and reader in _readers()
    reader.join(timeout=5)
    assert not reader.is_alive(), "an idle reader thread should end"
    _wait_once(client, "notifier-b")  # a later wait starts a fresh reader and works
    fresh = waiting.Notifier.for_client(client)._reader
    assert fresh is not None and fresh is not reader
    client.close()


def test_dropped_clients_are_not_kept(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "IDLE_UNSUBSCRIBE", 0.1)
    monkeypatch.setattr(waiting, "IDLE_STOP", 0.3)
    keys = []
    for i in range(5):
        client = redis.Redis.from_url(redis_url)
        _wait_once(client, f"notifier-drop-{i}")
        keys.append((os.getpid(), id(client)))
        assert keys[-1] in waiting.Notifier._registry
        client.close()
        del client
    deadline = time.monotonic() + 5
    while any(k in waiting.Notifier._registry for k in keys) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert not [k for k in keys if k in waiting.Notifier._registry]
