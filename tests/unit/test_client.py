"""The Redis URL and the per-app, per-process client."""

from __future__ import annotations

import os
import ssl

import pytest
import redis
from celery import Celery

from celery_redislock.celery.client import get_redis, redis_url
from celery_redislock.errors import ConfigurationError


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        ("redis://:pw@h:6380/2", "redis://:pw@h:6380/2"),
        ("rediss://h:6380/0?ssl_cert_reqs=required", "rediss://h:6380/0?ssl_cert_reqs=required"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
        ("redis+socket:///run/redis.sock?virtual_host=3", "unix:///run/redis.sock?db=3"),
        ("redis://a:1/0;redis://b:1/0", "redis://a:1/0"),
        (["redis://a:1/0", "redis://b:1/0"], "redis://a:1/0"),
    ],
)
def test_default_is_the_redis_broker(app: Celery, broker: object, expected: str) -> None:
    app.conf.update(broker_url=broker)
    assert redis_url(app) == expected


def test_explicit_url_wins(app: Celery) -> None:
    app.conf.update(broker_url="redis://broker:6379/0")
    app.conf.redislock_url = "redis://locks:6379/1"
    assert redis_url(app) == "redis://locks:6379/1"


@pytest.mark.parametrize("broker", ["amqp://guest:secret@rabbit//", "memory://", None])
def test_non_redis_broker_asks_for_redislock_url(app: Celery, broker: str | None) -> None:
    app.conf.update(broker_url=broker)
    with pytest.raises(ConfigurationError, match=r"redislock_url is not set .* set redislock_url"):
        redis_url(app)
    try:
        redis_url(app)
    except ConfigurationError as exc:
        assert "secret" not in str(exc)  # credentials are masked


@pytest.mark.parametrize("url", ["http://x", "", 5, "localhost:6379"])
def test_bad_redislock_url_is_named(app: Celery, url: object) -> None:
    app.conf.redislock_url = url
    with pytest.raises(ConfigurationError, match="redislock_url must be a redis://"):
        redis_url(app)


def test_bad_client_options(app: Celery) -> None:
    app.conf.redislock_url = "redis://h:1/0"
    app.conf.redislock_client_options = ["socket_timeout", 1]
    with pytest.raises(ConfigurationError, match="redislock_client_options must be a dict"):
        get_redis(app)
    app.conf.redislock_client_options = None
    app.conf.redislock_cluster = "yes"
    with pytest.raises(ConfigurationError, match="redislock_cluster"):
        get_redis(app)


def test_client_is_cached_per_app_and_works(app: Celery, redis_url: str) -> None:
    app.conf.redislock_url = redis_url
    other = Celery("other", set_as_current=False, broker=redis_url)
    client = get_redis(app)
    assert isinstance(client, redis.Redis)
    assert get_redis(app) is client
    assert get_redis(other) is not client
    assert client.ping()
    other.close()


def test_new_client_when_settings_change(app: Celery) -> None:
    app.conf.redislock_url = "redis://h1:6379/0"
    first = get_redis(app)
    app.conf.redislock_client_options = {"socket_timeout": 2.0}
    second = get_redis(app)
    assert second is not first
    assert second.connection_pool.connection_kwargs["socket_timeout"] == 2.0
    app.conf.redislock_url = "redis://h2:6379/0"
    assert get_redis(app).connection_pool.connection_kwargs["host"] == "h2"


def test_broker_tls_settings_apply_to_the_broker_url(app: Celery) -> None:
    app.conf.update(broker_url="rediss://h:6380/0")
    app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_NONE}
    kwargs = get_redis(app).connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == ssl.CERT_NONE
    app.conf.redislock_url = "rediss://other:6380/0"  # another server: not the broker's TLS
    assert "ssl_cert_reqs" not in get_redis(app).connection_pool.connection_kwargs


def test_forked_child_makes_its_own_client(app: Celery, redis_url: str) -> None:
    app.conf.redislock_url = redis_url
    parent = get_redis(app)
    parent.set("fork-test", "parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, then leave without running pytest's exit handlers
        try:
            child = get_redis(app)
            ok = child is not parent and child is get_redis(app) and child.ping()
            os.write(write, b"ok" if ok else b"same client")
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == b"ok"
    assert get_redis(app) is parent
    assert parent.get("fork-test") == b"parent"  # the child left our connection alone
