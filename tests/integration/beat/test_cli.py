"""``celery -A proj redislock beat``: the leader, since when, the last slot per entry
(the real command in a subprocess, on a lease and claims made here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import redis

from celery_redislock import RedisLock
from celery_redislock.celery.beat.claims import BeatKeys, Claims, lock_name

from ..workers import LOCKS_DB, db_url
from .beats import beat_module, module_env


def run_cli(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    module = beat_module(tmp_path, redis_url, schedule="{}", conf='{"redislock_beat_group": "g1"}')
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", f"{module.name}:app", "redislock", "beat", *args],
        cwd=tmp_path,
        env=module_env(module),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_shows_the_leader_since_when_and_the_last_slot_per_entry(
    tmp_path: Path, redis_url: str
) -> None:
    client = redis.Redis.from_url(db_url(redis_url, LOCKS_DB))
    client.delete(*BeatKeys.of("redislock", "g1").__dict__.values())
    nobody = run_cli(tmp_path, redis_url)
    assert nobody.returncode == 0, nobody.stderr
    assert "no beat leads" in nobody.stdout and "No slot sent yet" in nobody.stdout

    lease = RedisLock(client, lock_name("g1"), ttl=30).acquire(owner="host-a:42:abc")
    assert lease is not None
    claims = Claims(client, BeatKeys.of("redislock", "g1"), "host-a:42:abc")
    slot_ms = int(time.time()) * 1000
    assert claims.claim("every-second", slot_ms) == (True, slot_ms)
    try:
        shown = run_cli(tmp_path, redis_url, "--json")
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert document["group"] == "g1"
        assert document["leader"] == "host-a:42:abc"
        assert abs(document["since"] - time.time()) < 30
        [entry] = document["entries"]
        assert entry["name"] == "every-second"
        assert entry["slot"] == slot_ms / 1000
        assert entry["by"] == "host-a:42:abc"
        text = run_cli(tmp_path, redis_url).stdout
        assert "led by host-a:42:abc since" in text and "every-second" in text
    finally:
        lease.release()
        client.close()
