"""The asyncio notifier's reader against a real redis-server: a reader that ends while
a SUBSCRIBE it did not send is in flight leaves no successor behind on its closed
connection, and the waiters of that moment are still woken by pub/sub."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from celery_redislock import RedisLock
from celery_redislock.asyncio import AsyncLease, AsyncRedisLock
from celery_redislock.asyncio.notifier import AsyncNotifier

pytestmark = pytest.mark.serial  # wake-up latencies

T = TypeVar("T")


async def _until(check: Callable[[], T | None], timeout: float = 5.0) -> T:
    """``check()`` once it is truthy (polled every loop turn), or the test fails."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)
    return value


def test_a_reader_that_ends_while_a_subscribe_is_in_flight_leaves_no_broken_successor(
    r: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waiter A's channel is subscribed and read. Waiter B joins a second channel: its
    # SUBSCRIBE (the notifier's _start task) is held at the pub/sub's subscribe() until
    # the reader has ended -- cancelled, as its loop does at shutdown; a reader that
    # raised ends the same way. The SUBSCRIBE then completes, and _start makes sure a
    # reader runs. Before: that new reader read the None the old one's finally left
    # (AttributeError: 'NoneType' object has no attribute 'subscribed', an exception no
    # one retrieved), B's channel was marked subscribed on the closed connection, and
    # both waiters were left to their polls (up to 1 s). After: every task ends without
    # an exception and the releases wake both waiters by pub/sub at once.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        tasks: list[asyncio.Task[Any]] = []

        def factory(
            loop: asyncio.AbstractEventLoop,
            coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
            **kwargs: Any,
        ) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            tasks.append(task)
            return task

        loop.set_task_factory(factory)
        client = aioredis.Redis.from_url(redis_url)
        held = [RedisLock(r, name, ttl=30).acquire() for name in ("na", "nb")]
        assert held[0] is not None and held[1] is not None
        try:
            wait_a = asyncio.create_task(AsyncRedisLock(client, "na", ttl=30).acquire(timeout=10))
            notifier = await _until(lambda: AsyncNotifier.current(client))
            await _until(lambda: any(map(notifier.subscribed, list(notifier._channels))))
            reader = notifier._reader
            pubsub = notifier._pubsub
            assert reader is not None and pubsub is not None
            subscribe = pubsub.subscribe
            entered, gate = asyncio.Event(), asyncio.Event()

            async def held_subscribe(*channels: str) -> None:
                entered.set()
                await gate.wait()
                await subscribe(*channels)

            monkeypatch.setattr(pubsub, "subscribe", held_subscribe)
            wait_b = asyncio.create_task(AsyncRedisLock(client, "nb", ttl=30).acquire(timeout=10))
            await asyncio.wait_for(entered.wait(), 5)  # B's SUBSCRIBE is in flight
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            gate.set()
            await asyncio.sleep(0.3)  # B's SUBSCRIBE completes; a reader takes over
            failed = [
                (task.get_name(), repr(task.exception()))
                for task in tasks
                if task.done() and not task.cancelled() and task.exception() is not None
            ]
            assert not failed, failed
            woken: list[float] = []
            for lease, waiting in zip(held, (wait_a, wait_b), strict=True):
                released = time.monotonic()
                assert lease is not None and lease.release()
                got = await asyncio.wait_for(waiting, 5)
                woken.append(time.monotonic() - released)
                assert isinstance(got, AsyncLease) and await got.release()
            print(f"woken after {woken[0]:.3f} s and {woken[1]:.3f} s")
            assert max(woken) < 0.25, woken  # by pub/sub, not by a poll (every <= 1 s)
        finally:
            for lease in held:
                if lease is not None and not lease.released:
                    lease.release()
            await client.aclose()

    asyncio.run(main())


def test_a_message_not_from_a_release_is_ignored_and_the_reader_goes_on(
    r: redis.Redis, redis_url: str
) -> None:
    # The sync notifier's rule (tests/core/test_notifier.py), one read_wake for both.
    # Before: the reader task ended with a ValueError nobody retrieved, the waiter woken
    # by its poll. After: no task exception, the release wakes it by pub/sub.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        client = aioredis.Redis.from_url(redis_url)
        holder = RedisLock(r, "nf", ttl=30).acquire()
        assert holder is not None
        try:
            waiting = asyncio.create_task(AsyncRedisLock(client, "nf", ttl=30).acquire(timeout=10))
            notifier = await _until(lambda: AsyncNotifier.current(client))
            await _until(lambda: any(map(notifier.subscribed, list(notifier._channels))))
            reader = notifier._reader
            for channel in list(notifier._channels):
                for data in ("tok notanumber", "* -3", "tok 1 2"):
                    await client.publish(channel, data)
            await asyncio.sleep(0.3)
            assert reader is not None and not reader.done(), reader
            released = time.monotonic()
            assert holder.release()
            got = await asyncio.wait_for(waiting, 5)
            woken = time.monotonic() - released
            assert isinstance(got, AsyncLease) and await got.release()
            assert woken < 0.25, woken
            assert not errors, errors
        finally:
            if not holder.released:
                holder.release()
            await client.aclose()

    asyncio.run(main())
