"""What parking_for and rate_queue keep goes with its app: a closed app, dropped, frees
its client, so its metrics recorder no longer retries for a Redis that is gone."""

from __future__ import annotations

import gc
import weakref

from celery import Celery

from celery_redislock.celery.bounded.parking import parking_for
from celery_redislock.celery.client import get_redis
from celery_redislock.celery.metrics.recorder import recorder_for
from celery_redislock.celery.ratelimit.queues import rate_queue
from celery_redislock.core.keys import DEFAULT_PREFIX
from celery_redislock.testing import RedisServer

from ..helpers import wait_until


def test_a_dropped_app_takes_its_parking_queues_and_client_along() -> None:
    with RedisServer() as server:
        app = Celery("kept", set_as_current=False)
        app.conf.update(broker_url=server.url, redislock_url=server.url)
        client = get_redis(app)
        sem = parking_for(app, "kept", 1, 30.0, DEFAULT_PREFIX)
        assert parking_for(app, "kept", 1, 30.0, DEFAULT_PREFIX) is sem  # kept while used
        queue = rate_queue(app, "kept", ("2/s",))
        assert sem.capacity.client is client and queue.capacity.client is client
        recorder = recorder_for(client)
    recorder.add(DEFAULT_PREFIX, "permit", "kept", "granted")  # its Redis is gone
    app.close()
    apps, clients = weakref.ref(app), weakref.ref(client)
    del app, client, sem, queue

    def gone() -> bool:
        # Passes: the app (a cycle), then what was kept for it (a semaphore and its
        # capacity refer to each other); the recorder's thread holds the client while
        # it tries to send.
        gc.collect()
        return apps() is None and clients() is None

    wait_until(gone, timeout=10, what="the app and its client collected")
    # Nobody can read those counts: dropped (said), not retried until a flush gives up.
    assert recorder.flush(5)
