"""Celery on a Redis Cluster for its locks (``redislock_cluster = True``, the URL of
any node): a singleton task runs once for two calls, and a bounded task never runs
more than its limit at once; the broker and results stay on a plain Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from redis.cluster import RedisCluster

from celery_redislock import bounded_task, singleton_task
from celery_redislock.celery.client import get_redis
from celery_redislock.testing_cluster import LocalCluster

pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")


@pytest.fixture
def app(cluster: LocalCluster, redis_url: str) -> Iterator[Celery]:
    base = redis_url.rsplit("/", 1)[0]
    name = f"cl{uuid.uuid4().hex[:8]}"
    app = Celery(name, set_as_current=False)
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{base}/2",
        redislock_url=cluster.url,
        redislock_cluster=True,
        redislock_client_options={"socket_timeout": 5},
        task_default_queue=f"q-{name}",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    yield app
    app.close()


def test_singleton_and_bounded_tasks_lock_on_the_cluster(app: Celery) -> None:
    started, finish = threading.Event(), threading.Event()
    runs: list[tuple[float, float]] = []
    guard = threading.Lock()

    @singleton_task(app=app, shared=False)
    def refresh(user_id: int) -> str:
        started.set()
        finish.wait(10)
        return f"refreshed {user_id}"

    @bounded_task(app=app, shared=False, concurrency_limit=2, concurrency_wait=5)
    def call_api(n: int) -> int:
        begin = time.monotonic()
        time.sleep(0.2)
        with guard:
            runs.append((begin, time.monotonic()))
        return n

    client: Any = get_redis(app)
    assert isinstance(client, RedisCluster)
    with start_worker(
        app, pool="threads", concurrency=6, perform_ping_check=False, shutdown_timeout=20
    ):
        first = refresh.delay(7)
        second = refresh.delay(user_id=7)
        assert second.id == first.id  # the same job: nothing sent
        assert started.wait(10)
        held = list(client.scan_iter("redislock:*:holders"))  # on every primary
        assert len(held) == 1 and b"{" in held[0]  # the singleton's lock, by its hash tag
        finish.set()
        assert first.get(timeout=10) == "refreshed 7"
        results = [call_api.delay(n) for n in range(6)]
        assert [r.get(timeout=30) for r in results] == list(range(6))
    assert not list(client.scan_iter("redislock:*:holders"))  # everything released
    edges = sorted([(b, 1) for b, _ in runs] + [(e, -1) for _, e in runs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert len(runs) == 6 and most <= 2


def test_a_redelivered_copys_look_reads_the_lease_end_on_the_leases_node(app: Celery) -> None:
    # singleton/duplicates.py decides whether a first run renewed its lock by the end
    # of its lease on the lock Redis's clock (#24 review): on a cluster, the clock of
    # the node the lock lives on. Unrenewed, the end stays put; renewed, it moves.
    from celery_redislock.celery.options import options_of
    from celery_redislock.celery.singleton.duplicates import _lease_end, _unrenewed
    from celery_redislock.celery.singleton.leases import lock_for

    @singleton_task(app=app, shared=False, lock_ttl=5)
    def sync(user_id: int) -> None:
        return None

    options = options_of(sync).singleton
    key = f"redislock:test:{uuid.uuid4().hex[:8]}"
    lease = lock_for(sync, key, options).acquire(blocking=False)
    assert lease is not None
    try:
        end, left = _lease_end(sync, key, options)
        assert end is not None and left is not None and 4.0 < left <= 5.0
        time.sleep(0.3)
        assert not _unrenewed(sync, key, options, str(end - 1000))  # it ends later
        assert _unrenewed(sync, key, options, str(end))  # the same end: not renewed
        assert lease.extend(5)
        assert not _unrenewed(sync, key, options, str(end))  # renewed: it moved
    finally:
        lease.release()
