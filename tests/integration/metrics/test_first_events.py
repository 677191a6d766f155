"""The first events of a process, sent from several threads at once, are all counted
(#27): each thread's first event makes the app's sink and may make the app's client
(``get_redis`` takes no lock: two threads racing make two clients and one is dropped).
A sink made on the dropped client counted into a recorder whose client was gone --
every event of that app in that process, from then on, was dropped without a word."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_redislock import RedisLockTask
from celery_redislock.celery.client import get_redis
from celery_redislock.celery.metrics.read import read_counters
from celery_redislock.celery.metrics.recorder import recorder_for
from celery_redislock.celery.signals import singleton_duplicate

from ..conftest import MakeApp

THREADS = 8
APPS = 60


@pytest.fixture
def switching_often() -> Iterator[None]:
    """Threads switched every microsecond: the race of first events is likely at once
    (at the default 5 ms it happens too, but rarely)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _first_events_from_threads(app: Celery) -> None:
    @app.task(base=RedisLockTask, name="first.events")
    def body() -> None:
        """A task body."""

    # The task itself (the app finalized, its configuration loaded), not the lazy
    # proxy @app.task returns: Celery's proxy is evaluated without a lock.
    job = app.tasks["first.events"]
    barrier = threading.Barrier(THREADS)

    def send() -> None:
        barrier.wait()
        singleton_duplicate.send(sender=job, task_id="t", stage="enqueue", action="raise")

    threads = [threading.Thread(target=send) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_every_first_event_of_racing_threads_is_counted(
    make_app: MakeApp, locks: redis.Redis, switching_often: None
) -> None:
    apps = [make_app(redislock_prefix=f"first{n}") for n in range(APPS)]
    for app in apps:
        _first_events_from_threads(app)
    # These apps' recorders, not the process's flush(): that one also waits for the
    # recorders of earlier tests in this xdist worker whose redis-server has stopped
    # (their events stay pending, and it answers False, as it should in production).
    assert all(recorder_for(get_redis(app)).flush(10) for app in apps)
    counted = {
        prefix: sum(c.counts.get("refused_duplicate", 0) for c in read_counters(locks, prefix))
        for prefix in (f"first{n}" for n in range(APPS))
    }
    short = {prefix: count for prefix, count in counted.items() if count != THREADS}
    assert not short, f"apps whose events were not all counted (of {THREADS}): {short}"
