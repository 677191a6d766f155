"""``celery redislock exporter`` as a real ``celery`` subprocess and ``celery
redislock top`` in-process (#27)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import RedisLock, RedisSemaphore
from celery_redislock.celery.cli import redislock
from celery_redislock.celery.tokens import running_owner

from ..workers import BROKER_DB, LOCKS_DB, db_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exporter_command_serves_metrics(
    tmp_path: Path, redis_url: str, locks: redis.Redis
) -> None:
    conf = {
        "broker_url": db_url(redis_url, BROKER_DB),
        "redislock_url": db_url(redis_url, LOCKS_DB),
    }
    (tmp_path / "proj.py").write_text(
        textwrap.dedent(f"""\
            from celery import Celery

            app = Celery("proj")
            app.conf.update({conf!r})
        """)
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    port = _free_port()
    lease = RedisLock(locks, "held-by-test", ttl=60).acquire(blocking=False)
    assert lease is not None
    command = [sys.executable, "-m", "celery", "-A", "proj", "redislock", "exporter"]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 30, ""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert "celery_redislock_locks_held 1.0" in body, process.stderr
        assert "celery_redislock_up 1.0" in body
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert f"127.0.0.1:{port}/metrics" in err  # where it serves, said at start


def test_top_shows_locks_and_pools(redis_url: str, locks: redis.Redis) -> None:
    lease = RedisLock(locks, "proj.tasks.report:1a2b", ttl=60).acquire(
        blocking=False, owner=running_owner("task-0001")
    )
    permit = RedisSemaphore(locks, "stripe-api", limit=3, ttl=60).acquire(blocking=False)
    assert lease is not None and permit is not None
    app = Celery("top", set_as_current=False)
    app.conf.update(redislock_url=db_url(redis_url, LOCKS_DB))
    try:
        obj = CLIContext(app=app, no_color=True, workdir=None)
        result = CliRunner().invoke(redislock, ["top", "-n", "2", "--interval", "0.1"], obj=obj)
    finally:
        app.close()
    assert result.exit_code == 0, result.output
    assert result.output.count("locks held: 1") == 2  # two refreshes
    assert "proj.tasks.report:1a2b" in result.output and "task-0001" in result.output
    assert "stripe-api" in result.output and "1/3" in result.output
