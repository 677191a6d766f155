"""The background threads of a worker's main process (the rate pump, the sweeper) stop
with their worker, also with an in-process one (``start_worker``), which ends by a cold
shutdown that sends no ``worker_shutdown`` (#30)."""

from __future__ import annotations

import threading

from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redislock import rate_limited_task


def _pumps_of(app: Celery) -> list[threading.Thread]:
    # Found by name, not through the registry: what runs is what counts.
    return [
        thread
        for thread in threading.enumerate()
        if thread.name == "celery_redislock-rate-pump" and getattr(thread, "app", None) is app
    ]


def test_an_in_process_worker_stops_its_pump_when_it_stops(app: Celery) -> None:
    @rate_limited_task(app=app, global_rate_limit="5/s")
    def call() -> None:
        pass

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        (pump,) = _pumps_of(app)
        assert pump.is_alive()
    assert not pump.is_alive()
    assert _pumps_of(app) == []
