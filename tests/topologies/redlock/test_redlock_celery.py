"""Celery with ``redislock_urls``: singleton locks are Redlock locks on every master,
a bounded task is refused at definition, bad URL lists are named."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import ConfigurationError, RedisLockTask, SingletonTask, bounded_task
from celery_redislock.testing import RedisServer
from tests.integration.conftest import MakeApp
from tests.topologies.redlock.conftest import mark_booted

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")


def urls(masters: list[RedisServer], count: int = 3) -> list[str]:
    return [server.url for server in masters[:count]]


def held_on(clients: list[redis.Redis], expected: list[int] | None = None) -> list[int]:
    """How many singleton lock keys each master holds; with ``expected``, once they
    all do (for up to 2 s): a call returns once a majority answered, the others
    run it when they get to it."""
    deadline = time.monotonic() + 2.0
    while True:
        held = [len(client.keys("redislock:lock:*:holders")) for client in clients]
        if expected is None or held == expected or time.monotonic() > deadline:
            return held
        time.sleep(0.01)


def test_singleton_locks_are_redlock_locks_on_every_master(
    make_app: MakeApp, worker: Any, masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    app: Celery = make_app(redislock_urls=urls(masters), redislock_queued_ttl=60)
    mark_booted(clients[:3], 60.0)
    started, go = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, lock_ttl=2)
    def job(n: int) -> int:
        started.set()
        go.wait(10)
        return n

    worker(app)
    first = job.delay(1)
    assert job.delay(1).id == first.id  # the same job: the queued copy's result
    assert started.wait(10)
    assert held_on(clients[:3], [1, 1, 1]) == [1, 1, 1]  # a lease on each of the three masters
    assert held_on(clients[3:]) == [0, 0]
    assert job.delay(1).id == first.id  # the running copy's
    go.set()
    assert first.get(timeout=10) == 1
    assert held_on(clients[:3], [0, 0, 0]) == [0, 0, 0]
    assert job.delay(1).id != first.id  # free again


def test_a_bounded_task_under_redlock_is_refused_at_definition(
    make_app: MakeApp, masters: list[RedisServer]
) -> None:
    app: Celery = make_app(redislock_urls=urls(masters))
    message = "task 'capped': concurrency_limit=3 cannot be used with redislock_urls"
    with pytest.raises(ConfigurationError, match=message):
        app.task(base=RedisLockTask, name="capped", lazy=False, concurrency_limit=3)(noop)
    with pytest.raises(ConfigurationError, match=message):
        bounded_task(app=app, name="capped", concurrency_limit=3)(noop)
    app.task(base=SingletonTask, name="fine", lazy=False)(noop)  # a singleton is fine


def noop() -> None:
    """A task body."""


@pytest.mark.parametrize("bad", ["one-string", "even", "same"])
def test_bad_redislock_urls_are_named(
    make_app: MakeApp, masters: list[RedisServer], bad: str
) -> None:
    value: Any = {
        "one-string": masters[0].url,
        "even": urls(masters, 4),
        "same": [masters[0].url, masters[0].url.replace("/0", "/5"), masters[1].url],
    }[bad]
    app: Celery = make_app(redislock_urls=value)

    @app.task(base=SingletonTask)
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match="redislock_urls"):
        job.delay()


def test_a_retry_keeps_its_redlock_lease_through_the_countdown(
    make_app: MakeApp, worker: Any, masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    app: Celery = make_app(redislock_urls=urls(masters), redislock_queued_ttl=30)
    mark_booted(clients[:3], 30.0)
    attempts: list[int] = []
    retrying, second, go = threading.Event(), threading.Event(), threading.Event()

    @app.task(base=SingletonTask, bind=True, lock_ttl=2, max_retries=1)
    def flaky(self: Any) -> int:
        attempts.append(self.request.retries)
        if not self.request.retries:
            retrying.set()
            raise self.retry(countdown=1)
        second.set()
        go.wait(10)
        return len(attempts)

    worker(app)
    first = flaky.delay()
    assert retrying.wait(10)
    time.sleep(0.3)  # in the countdown: the lease was handed to the retry message
    assert held_on(clients[:3], [1, 1, 1]) == [1, 1, 1]
    assert flaky.delay().id == first.id
    assert second.wait(10)  # the retry adopted it
    assert held_on(clients[:3], [1, 1, 1]) == [1, 1, 1]
    assert flaky.delay().id == first.id
    go.set()
    assert first.get(timeout=10) == 2 and attempts == [0, 1]
    assert held_on(clients[:3], [0, 0, 0]) == [0, 0, 0]
