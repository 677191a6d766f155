"""Integration fixtures: Celery apps on the private Redis, in-process workers, signals.

Each test gets its own app (``make_app``/``app``) with its own queue, so workers of
different tests never take each other's messages. Databases: broker 1, results 2,
locks 3 (see :mod:`.workers`); ``locks`` is a client on the locks database, flushed
before each test.
"""

from __future__ import annotations

import contextlib
import gc
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.utils.dispatch import Signal

from .workers import BROKER_DB, LOCKS_DB, RESULTS_DB, db_url

MakeApp = Callable[..., Celery]


def pytest_configure(config: pytest.Config) -> None:
    # Celery's result backend (one client per thread) and the per-app lock clients of
    # finished tests' apps are closed by the garbage collector, at any later moment;
    # with warnings as errors their ResourceWarning would fail an unrelated test.
    config.addinivalue_line("filterwarnings", "ignore:unclosed <socket:ResourceWarning")


class _TestApp(Celery):
    """An app whose tasks are its own: named after the app, never shared with the
    apps of later tests (``@app.task`` is ``shared=True`` by default)."""

    def task(self, *args: Any, **options: Any) -> Any:
        options.setdefault("shared", False)
        return super().task(*args, **options)

    def gen_task_name(self, name: str, module: str) -> str:
        # Unique per app; the module too, as shared tasks of modules imported by other
        # tests (see workers.AppModule) join every app created after them.
        return f"{self.main}.{module}.{name}"


@pytest.fixture
def locks(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the locks database, flushed before the test."""
    client = redis.Redis.from_url(db_url(redis_url, LOCKS_DB))
    client.flushdb()
    yield client
    client.close()
    # Results still pending unsubscribe from the backend when collected: let that
    # happen now, while the server is up (at exit it would fail, noisily).
    gc.collect()


@pytest.fixture
def make_app(redis_url: str, locks: redis.Redis) -> Iterator[MakeApp]:
    """``make_app(**conf)``: a new app on the test Redis with its own default queue."""
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        name = f"it{uuid.uuid4().hex[:8]}"
        app = _TestApp(name, set_as_current=False)
        app.conf.update(
            broker_url=db_url(redis_url, BROKER_DB),
            result_backend=db_url(redis_url, RESULTS_DB),
            redislock_url=db_url(redis_url, LOCKS_DB),
            task_default_queue=f"q-{name}",
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
        )
        app.conf.update(conf)
        apps.append(app)
        return app

    yield make
    gc.collect()  # see ``locks``
    for app in apps:
        app.close()


@pytest.fixture
def app(make_app: MakeApp) -> Celery:
    """A fresh app (see ``make_app``)."""
    return make_app()


@pytest.fixture
def worker() -> Iterator[Callable[..., Any]]:
    """``worker(app, pool="threads", concurrency=2)``: start an in-process worker on
    the app's default queue; stopped when the test ends. Define tasks first."""
    with contextlib.ExitStack() as stack:

        def start(app: Celery, pool: str = "threads", concurrency: int = 2, **kw: Any) -> Any:
            return stack.enter_context(
                start_worker(
                    app,
                    pool=pool,
                    concurrency=concurrency,
                    perform_ping_check=False,
                    shutdown_timeout=20,
                    **kw,
                )
            )

        yield start


@pytest.fixture
def capture() -> Iterator[Callable[[Signal], list[dict[str, Any]]]]:
    """``capture(signal)``: a list that receives each sending's keywords (+ sender)."""
    connected: list[tuple[Signal, Callable[..., None]]] = []

    def connect(signal: Signal) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        def receiver(sender: Any = None, **kwargs: Any) -> None:
            seen.append({"sender": sender, **kwargs})

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
        return seen

    yield connect
    for signal, receiver in connected:
        signal.disconnect(receiver)
