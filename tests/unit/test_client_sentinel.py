"""Sentinel URLs and the result-backend default: where the locks' Redis comes from."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redislock.celery.client import connection_source, get_redis, transport_options
from celery_redislock.errors import ConfigurationError

SENTINELS = "sentinel://:pw@s1:26379/2;sentinel://s2:26380;sentinel://s3"


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"broker_url": SENTINELS}, (SENTINELS, "broker_transport_options")),
        ({"broker_url": SENTINELS.split(";")}, (SENTINELS, "broker_transport_options")),
        (
            {"broker_url": "amqp://rabbit//", "result_backend": "redis://r:6379/1"},
            ("redis://r:6379/1", "result_backend_transport_options"),
        ),
        (
            {"broker_url": "amqp://rabbit//", "result_backend": SENTINELS},
            (SENTINELS, "result_backend_transport_options"),
        ),
        (
            {"broker_url": "redis://b/0", "result_backend": "redis://r/1"},
            ("redis://b/0", "broker_transport_options"),
        ),
        (
            {"broker_url": "amqp://rabbit//", "redislock_url": SENTINELS},
            (SENTINELS, "redislock_transport_options"),
        ),
    ],
)
def test_source_of_the_url(app: Celery, conf: dict[str, object], expected: tuple[str, str]) -> None:
    app.conf.update(conf)
    assert connection_source(app) == expected


def test_rabbitmq_without_redis_backend_asks_for_redislock_url(app: Celery) -> None:
    app.conf.update(broker_url="amqp://guest:secret@rabbit//", result_backend="rpc://")
    with pytest.raises(ConfigurationError, match="set redislock_url") as caught:
        connection_source(app)
    assert "secret" not in str(caught.value)


def test_transport_options_default_to_the_source(app: Celery) -> None:
    app.conf.update(
        broker_transport_options={"master_name": "b"},
        result_backend_transport_options={"master_name": "r"},
    )
    assert transport_options(app, "broker_transport_options") == {"master_name": "b"}
    assert transport_options(app, "result_backend_transport_options") == {"master_name": "r"}
    assert transport_options(app, "redislock_transport_options") == {}
    app.conf.redislock_transport_options = {"master_name": "own"}
    assert transport_options(app, "broker_transport_options") == {"master_name": "own"}
    app.conf.redislock_transport_options = ["master_name"]
    with pytest.raises(ConfigurationError, match="redislock_transport_options must be a dict"):
        transport_options(app, "broker_transport_options")


@pytest.mark.parametrize(
    ("conf", "setting"),
    [
        ({"broker_url": SENTINELS}, "broker_transport_options"),
        (
            {"broker_url": SENTINELS, "broker_transport_options": {"master_name": ""}},
            "broker_transport_options",
        ),
        (
            {
                "broker_url": "amqp://x//",
                "redislock_url": SENTINELS,
                "broker_transport_options": {"master_name": "not-this-one"},
            },
            "redislock_transport_options",
        ),
    ],
)
def test_sentinel_url_without_master_name_names_the_setting(
    app: Celery, conf: dict[str, object], setting: str
) -> None:
    app.conf.update(conf)
    with pytest.raises(ConfigurationError, match=rf"{setting}\['master_name'\]") as caught:
        get_redis(app)
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "sentinel://",
        "sentinel://h:0",
        "sentinel://h:1;redis://h:2",
        "sentinel://h:1/db",
        "sentinel://h:x",
    ],
)
def test_bad_sentinel_urls_are_named(app: Celery, url: str) -> None:
    app.conf.update(redislock_url=url, redislock_transport_options={"master_name": "m"})
    with pytest.raises(ConfigurationError, match="Sentinel URL"):
        get_redis(app)


def test_sentinel_client_is_master_for_the_named_primary(app: Celery) -> None:
    app.conf.update(
        broker_url=SENTINELS,
        broker_transport_options={
            "master_name": "main",
            "sentinel_kwargs": {"password": "sentinel-pw"},
        },
        redislock_client_options={"socket_timeout": 2.5},
    )
    client = get_redis(app)
    pool = client.connection_pool
    assert pool.service_name == "main" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (2, "pw", 2.5)
    sentinels = pool.sentinel_manager.sentinels
    addresses = [s.connection_pool.connection_kwargs for s in sentinels]
    assert [(a["host"], a["port"]) for a in addresses] == [
        ("s1", 26379),
        ("s2", 26380),
        ("s3", 26379),
    ]
    assert all(a["password"] == "sentinel-pw" for a in addresses)
    assert get_redis(app) is client  # cached
    app.conf.broker_transport_options = {"master_name": "other"}
    assert get_redis(app) is not client  # the options are part of the client's identity


def test_sentinel_with_cluster_is_refused(app: Celery) -> None:
    app.conf.update(
        redislock_url=SENTINELS,
        redislock_transport_options={"master_name": "m"},
        redislock_cluster=True,
    )
    with pytest.raises(ConfigurationError, match="redislock_cluster"):
        get_redis(app)
