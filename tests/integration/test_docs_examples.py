"""Every code example of the documentation site is a file under docs/examples/ that the
pages include (pymdownx.snippets) and this module runs, against private redis-servers (#28)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_redislock.testing import RedisServer
from celery_redislock.testing_cluster import LocalCluster
from celery_redislock.testing_sentinel import SentinelGroup

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
ONE_REDIS = [
    "singleton",
    "bounded",
    "ratelimit",
    "ratelimit_api",
    "ratelimit_task",
    "ratelimit_429",
    "beat",
    "core_lock",
    "asyncio_semaphore",
    "metrics_collector",
    "typed_delay",
]


def run_example(name: str) -> None:
    """Run docs/examples/<name>.py as a script, as a reader would: in a process of its
    own, so that its tasks (``app.task`` makes shared tasks, which join every app
    created later in the process) never reach the apps of other tests."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{name}.py exited {done.returncode}:\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("name", ONE_REDIS)
def test_example_runs(name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name.startswith("asyncio") and sys.version_info < (3, 11):
        pytest.skip("celery_redislock.asyncio needs Python >= 3.11")
    monkeypatch.setenv("REDIS_URL", redis_url)
    run_example(name)


@pytest.fixture
def three_masters() -> Iterator[list[str]]:
    servers = [RedisServer() for _ in range(3)]
    try:
        for server in servers:
            server.start()
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.stop()


def test_redlock_example_runs(three_masters: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh master refuses grants for max_ttl (the example's: its ttl, 30 s) after it
    # starts (docs/guides/redlock.md); these servers never held a lease, so mark them
    # past that grace, as tests/topologies/redlock/conftest.py's mark_booted does.
    for url in three_masters:
        with redis.Redis.from_url(url) as client:
            run_id = client.info("server")["run_id"]
            client.set(f"redislock:redlock:boot:{run_id}:30000", 1)
    monkeypatch.setenv("REDLOCK_URLS", ",".join(three_masters))
    run_example("redlock")


def test_sentinel_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    with SentinelGroup() as group:
        monkeypatch.setenv("SENTINELS", ",".join(f"{h}:{p}" for h, p in group.sentinels))
        run_example("sentinel")


def test_cluster_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    with LocalCluster() as cluster:
        node = cluster.running()[0]
        monkeypatch.setenv("CLUSTER_NODE", f"127.0.0.1:{node.port}")
        run_example("cluster")


def test_every_example_is_run_here() -> None:
    """A new file under docs/examples/ must be added to this module."""
    run_here = {*ONE_REDIS, "redlock", "sentinel", "cluster"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == run_here


def test_every_example_is_shown_in_the_docs() -> None:
    """Each example is included by at least one page (so none is dead)."""
    pages = "".join(p.read_text() for p in EXAMPLES.parent.rglob("*.md"))
    for example in EXAMPLES.glob("*.py"):
        assert f'"{example.name}:' in pages or f'"{example.name}"' in pages, example.name
