"""Where the park journal goes (no Redis needed: clients connect lazily), and what a
journaled value holds."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import celery_redislock.celery.bounded.journal as journal_module
from celery_redislock.celery.bounded.journal import ParkSpec, journal_for, read_value, record
from celery_redislock.errors import ConfigurationError

SENTINELS = "sentinel://s1:26379;sentinel://s2:26379"


@pytest.mark.parametrize(
    ("conf", "journaled"),
    [
        ({"broker_url": "redis://h:6379/1"}, False),  # the locks default to the broker
        (
            {"broker_url": "redis://localhost/1", "redislock_url": "redis://127.0.0.1:6379/3"},
            False,
        ),  # one server, two spellings
        ({"broker_url": "redis://h:6379/1", "redislock_url": "redis://locks:6379/0"}, True),
        ({"broker_url": "redis://h:6379/1", "redislock_url": "redis://h:6380/0"}, True),
        (
            {
                "broker_url": "redis://h:6379/1;redis://h2:6379/1",
                "redislock_url": "redis://h2:6379/0",
            },
            True,
        ),  # a failover list: the first
        ({"broker_url": "amqp://rabbit//", "result_backend": "redis://r:6379/1"}, False),
        (
            {
                "broker_url": "amqp://rabbit//",
                "redislock_url": "redis://l:6379/0",
                "redislock_park_journal_url": "redis://r:6379/1",
            },
            True,
        ),
        (
            {
                "broker_url": "redis://h:6379/1",
                "redislock_url": "redis://l:6379/0",
                "redislock_park_journal_url": False,
            },
            False,
        ),
        ({"broker_url": SENTINELS, "broker_transport_options": {"master_name": "m"}}, False),
        (
            {
                "broker_url": SENTINELS,
                "broker_transport_options": {"master_name": "m"},
                "redislock_url": "redis://locks:6379/0",
            },
            True,
        ),
    ],
)
def test_the_journal_is_kept_on_another_redis_than_the_locks(
    app: Celery, conf: dict[str, Any], journaled: bool
) -> None:
    app.conf.update(conf)
    assert (journal_for(app) is not None) is journaled


def test_a_bad_journal_url_is_refused(app: Celery) -> None:
    app.conf.update(broker_url="redis://h/1", redislock_park_journal_url="amqp://x//")
    with pytest.raises(ConfigurationError, match="redislock_park_journal_url"):
        journal_for(app)


def test_a_journaled_value_round_trips_and_anything_else_is_refused(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured: list[tuple[str, bytes]] = []

    class Journal:
        entries_key = "journal"

        def put(self, entry_id: str, value: bytes, keep: float) -> None:
            captured.append((entry_id, value))

    monkeypatch.setattr(journal_module, "_state", lambda _app: (Journal(), 60.0))
    spec = ParkSpec("semaphore", "api {x}", "p", (3, 2.5))
    record(app, "id1", b"RLP1 x y\n\x00body", spec=spec, owner="task-1")
    ((entry_id, value),) = captured
    assert entry_id == "id1"
    assert read_value(value) == (spec, "task-1", b"RLP1 x y\n\x00body")
    # A value journaled before parking took other kinds of capacity: a semaphore's.
    old = b'["api {x}", 3, 2.5, "p", "task-1"]\nRLP1 x y\n\x00body'
    assert read_value(old) == (spec, "task-1", b"RLP1 x y\n\x00body")
    for bad in (b"", b"nonsense\npayload", b'["api", 0, 1, "p", "o"]\nx', b'["api"]\nx'):
        with pytest.raises(ValueError, match="not a journaled parked run"):
            read_value(bad)
