"""How long a pool remembers a consumed park token (settings.taken_memory): twice the
broker's redelivery delay, at least an hour -- a message whose ack was lost must still
find its token known when the broker hands it out again."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redislock.celery.bounded.parking import parking_for
from celery_redislock.celery.bounded.settings import taken_memory
from celery_redislock.errors import ConfigurationError


def _app(broker: str = "redis://localhost:1/1", **options: object) -> Celery:
    app = Celery("t", set_as_current=False, broker=broker)
    app.conf.broker_transport_options = options
    app.conf.redislock_url = "redis://localhost:1/3"
    return app


def test_twice_the_visibility_timeout_at_least_an_hour() -> None:
    assert taken_memory(_app()) == 7200.0  # kombu's Redis default: restored after 1 h
    assert taken_memory(_app(visibility_timeout=43200)) == 86400.0
    assert taken_memory(_app(visibility_timeout=60)) == 3600.0
    assert taken_memory(_app("amqp://guest@localhost//")) == 3600.0  # redelivered at once
    assert taken_memory(_app("sqs://", visibility_timeout=1800)) == 3600.0


def test_a_pool_remembers_its_tokens_that_long() -> None:
    app = _app(visibility_timeout=10800)
    assert parking_for(app, "api", 1, 30.0, "redislock")._taken_ms == 21_600_000


@pytest.mark.parametrize("bad", ["an hour", -1, float("nan"), True])
def test_a_bad_visibility_timeout_is_named(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"visibility_timeout.*got"):
        taken_memory(_app(visibility_timeout=bad))
