"""The kombu workaround: closing a collected Redis connection that still holds an
unacknowledged message (what celery 5.7's consumer does on a lost broker connection)
raises AttributeError -- a worker exit -- without it, and nothing with it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection, Exchange, Queue

from celery_redislock.celery import upstream


@pytest.fixture
def unpatched() -> Iterator[None]:
    patched = upstream.installed()
    upstream.uninstall()  # another test's worker installed it: out for this test
    yield
    if patched:
        upstream.install()


def _close_a_collected_channel(url: str) -> None:
    """What the consumer's second close meets: a channel still holding an unacked
    message, whose transport was collected (its client gone) and whose connection
    pool the outage disconnected."""
    queue = Queue(f"kombu-fix-{uuid.uuid4().hex[:8]}", Exchange("kombu-fix"), "k")
    connection = Connection(url)
    connection.Producer().publish(
        {"n": 1}, exchange=queue.exchange, routing_key="k", declare=[queue]
    )
    channel = connection.default_channel
    assert queue(channel).get(no_ack=False) is not None  # delivered, not acknowledged
    connection.transport.client = None  # what collect() leaves behind
    channel._pool = None
    try:
        channel.close()  # restores the unacked message: builds a new pool
    finally:
        connection.transport.client = connection
        connection.close()


def test_close_after_collect_fails_without_the_fix(redis_url: str, unpatched: None) -> None:
    with pytest.raises(AttributeError, match="hostname"):
        _close_a_collected_channel(redis_url)


def test_the_fix_raises_a_connection_error_close_ignores(redis_url: str) -> None:
    assert upstream.install() and upstream.install()  # idempotent
    with Connection(redis_url) as connection:
        connection_errors = connection.connection_errors
    with pytest.raises(connection_errors):
        _close_a_collected_channel(redis_url)
