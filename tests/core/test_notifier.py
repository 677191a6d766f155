"""The shared subscriber: one connection per client, read by one thread that ends
once its channels are idle."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import redis

from celery_redislock import RedisLock
from celery_redislock.core import notifier as notifier_module
from celery_redislock.core.notifier import Notifier, Waiter
from celery_redislock.testing import RedisServer


def _wait_once(client: redis.Redis, name: str) -> None:
    """Make one blocking acquire wait (so it subscribes), then let it through."""
    lock = RedisLock(client, name, ttl=5)
    holder = lock.acquire()
    assert holder is not None
    timer = threading.Timer(0.05, holder.release)
    timer.start()
    assert lock.acquire(timeout=5) is not None
    timer.join()


def test_one_reader_thread_per_client_ending_once_its_channels_are_idle(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notifier_module, "IDLE_UNSUBSCRIBE", 0.1)
    client = redis.Redis.from_url(redis_url)
    notifier = Notifier.for_client(client)
    _wait_once(client, "notifier-a")
    reader = notifier._reader
    assert reader is not None and reader.name == "celery-redislock-notifier"
    _wait_once(client, "notifier-a")  # the subscription (and its reader) reused
    _wait_once(client, "notifier-b")
    assert notifier._reader is reader
    reader.join(5)  # idle past IDLE_UNSUBSCRIBE and a read slice: it ends
    assert not reader.is_alive() and notifier._reader is None  # none left behind
    _wait_once(client, "notifier-a")  # a new one when waiters come back
    assert notifier._reader is not None and notifier._reader is not reader
    client.close()


def test_idle_channels_are_unsubscribed_by_a_later_reader(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notifier_module, "IDLE_UNSUBSCRIBE", 0.1)
    client = redis.Redis.from_url(redis_url)
    _wait_once(client, "notifier-idle")
    channel = f"{RedisLock(client, 'notifier-idle').keys.channel}:*"
    assert client.pubsub_channels(channel)
    time.sleep(1.2)  # past IDLE_UNSUBSCRIBE and one read slice
    _wait_once(client, "notifier-other")
    deadline = time.monotonic() + 5
    while client.pubsub_channels(channel) and time.monotonic() < deadline:
        _wait_once(client, "notifier-other")
    assert not client.pubsub_channels(channel)
    client.close()


def test_reading_passes_from_waiter_to_waiter(redis_url: str) -> None:
    # Six threads wait at once; each release wakes the next in order, each promptly
    # (not at its 1 s poll).
    client = redis.Redis.from_url(redis_url)
    lock = RedisLock(client, "notifier-turns", ttl=10)
    holder = lock.acquire()
    assert holder is not None
    got: list[float] = []

    def wait_and_pass() -> None:
        lease = lock.acquire(timeout=20)
        assert lease is not None
        got.append(time.monotonic())
        lease.release()

    threads = [threading.Thread(target=wait_and_pass) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while client.zcard(lock.keys.queue) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    holder.release()
    for thread in threads:
        thread.join(30)
    assert len(got) == 6 and max(got) - started < 0.9
    client.close()


def test_dropped_clients_are_not_kept(redis_url: str) -> None:
    keys = []
    for i in range(5):
        client = redis.Redis.from_url(redis_url)
        _wait_once(client, f"notifier-drop-{i}")
        keys.append(id(client))
        assert keys[-1] in Notifier._registry
        client.close()
        del client
    deadline = time.monotonic() + 5
    while any(k in Notifier._registry for k in keys) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert not [k for k in keys if k in Notifier._registry]


def test_a_subscribe_that_failed_while_redis_was_down_is_sent_again(
    redis_url: str, redis_server: RedisServer | None
) -> None:
    # redis-py re-subscribes on reconnect only the channels whose SUBSCRIBE was sent.
    # A waiter that joined while Redis was down must not leave its process deaf on
    # that channel (polling once a second) for as long as waiters keep coming.
    if redis_server is None:
        pytest.skip("needs the private redis-server")
    client = redis.Redis.from_url(redis_url)
    notifier = Notifier.for_client(client)
    waiter = Waiter()
    redis_server.stop()
    try:
        notifier._join("notifier-down", "tok-down", waiter)
    finally:
        redis_server.start()
    assert not notifier.subscribed("notifier-down")
    publisher = redis.Redis.from_url(redis_url)
    stop = threading.Event()

    def keep_publishing() -> None:
        while not stop.wait(0.05):
            publisher.publish("notifier-down", "tok-down")

    thread = threading.Thread(target=keep_publishing)
    thread.start()
    try:
        started = time.monotonic()
        notifier.wait(waiter, 5.0)
        assert waiter.notified, "the channel was never subscribed again"
        assert time.monotonic() - started < 3.0
        assert notifier.subscribed("notifier-down")
    finally:
        stop.set()
        thread.join()
        notifier._leave("notifier-down", "tok-down")
        publisher.close()
        client.close()


def test_a_message_not_from_a_release_is_ignored_and_the_reader_goes_on(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Anyone may PUBLISH on a wake channel. Before: "tok notanumber" raised ValueError in
    # the reader thread, which ended; the waiter was woken by its poll (up to 1 s).
    # After: such messages name no one, and the release wakes the waiter by pub/sub.
    crashed: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    client = redis.Redis.from_url(redis_url)
    lock = RedisLock(client, "notifier-foreign", ttl=10)
    holder = lock.acquire()
    assert holder is not None
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(lock.acquire(timeout=10) and time.monotonic())
    )
    thread.start()
    notifier = Notifier.for_client(client)
    deadline = time.monotonic() + 5
    while not any(map(notifier.subscribed, list(notifier._channels))):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for channel in list(notifier._channels):
        for data in ("tok notanumber", "* -3", "tok 1 2"):
            client.publish(channel, data)
    time.sleep(0.3)
    started = time.monotonic()
    holder.release()
    thread.join(10)
    assert not crashed, crashed
    assert got and got[0] - started < 0.5, got[0] - started  # a poll: up to 1 s
    client.close()
