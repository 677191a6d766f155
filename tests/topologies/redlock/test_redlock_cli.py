"""``celery redislock list`` / ``inspect`` with ``redislock_urls``: every master read,
each lock shown per master with how many hold it (one master down included)."""

from __future__ import annotations

import json
from typing import Any

import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import RedisLock, RedlockLock
from celery_redislock.celery.cli import redislock
from celery_redislock.testing import RedisServer
from tests.topologies.redlock.conftest import mark_booted


def invoke(masters: list[RedisServer], *args: str) -> Any:
    app = Celery("cli-redlock", set_as_current=False)
    app.conf.update(redislock_urls=[server.url for server in masters[:3]])
    try:
        return CliRunner().invoke(
            redislock, list(args), obj=CLIContext(app=app, no_color=True, workdir=None)
        )
    finally:
        app.close()


def test_list_and_inspect_show_every_master(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    mark_booted(clients[:3], 5.0)
    lease = RedlockLock(clients[:3], "report", ttl=5.0).acquire(blocking=False, owner="task-1")
    assert lease is not None
    stray = RedisLock(clients[2], "stray").acquire(blocking=False)  # one master only
    assert stray is not None
    masters[1].kill()

    listed = invoke(masters, "list")
    assert listed.exit_code == 0, listed.output
    assert "lock 'report': held on 2 of 3 masters, held by a majority" in listed.output
    assert "lock 'stray': held on 1 of 3 masters, not held by a majority" in listed.output
    assert f"== master {masters[1].url} ==\nunreachable: cannot reach Redis" in listed.output
    assert listed.output.count("task-1") == 2

    document = json.loads(invoke(masters, "list", "--json").output)
    assert document["redlock"] is True and document["quorum"] == 2
    assert document["held_by_majority"] == ["report"]
    assert [("error" in master) for master in document["masters"]] == [False, True, False]
    fences = [
        primitive["fence"]
        for master in document["masters"]
        for primitive in master.get("primitives", [])
        if primitive["name"] == "report"
    ]
    assert fences == [lease.fence, lease.fence]

    inspected = invoke(masters, "inspect", "report")
    assert inspected.exit_code == 0, inspected.output
    assert "held on 2 of 3 masters" in inspected.output
    assert invoke(masters, "inspect", "nothing").exit_code == 3


def test_release_by_owner_on_every_master(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    mark_booted(clients[:3], 5.0)
    lock = RedlockLock(clients[:3], "stuck", ttl=5.0)
    assert lock.acquire(blocking=False, owner="task-9") is not None
    masters[2].kill()
    refused = invoke(masters, "release", "stuck", "--owner", "task-8")
    assert refused.exit_code == 1 and "not held by 'task-8'" in refused.output
    done = invoke(masters, "release", "stuck", "--owner", "task-9", "--json")
    assert done.exit_code == 0, done.output
    document = json.loads(done.output)
    assert document["released"] == 2 and document["owners"] == ["task-9"]
    assert document["unreachable"] == [masters[2].url]
    assert lock.acquire(blocking=False) is not None  # free on the two left: a majority
