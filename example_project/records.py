"""What the example's tasks write down, so the driver can check and draw their runs.

Each task body runs inside :meth:`Recorder.run`, which appends one :class:`Run` to a
Redis list when the body ends: what must not overlap (the *subject*), which worker
process ran it, and when -- in **Redis server time**, one clock for every worker, as
``celery_redislock`` itself uses. The body runs while the task holds its lock or
permit (both are taken before the body starts and given back after it ends), so two
overlapping recorded runs would mean two overlapping holders.

Signal receivers count events (duplicates refused, runs parked) in a Redis hash
with :meth:`Recorder.count`, from whichever process sent the signal: beat, a worker
or the driver.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import redis
from celery import current_task

__all__ = ["Recorder", "Run", "short_name"]


@dataclass(frozen=True)
class Run:
    """One execution of a task body, as the task recorded it.

    ``subject`` is what must not run twice at once (``"nightly_report"``,
    ``"sync_user(3)"``) or the pool that caps it (``"partner-api"``); ``start`` and
    ``end`` are Redis server time in epoch seconds.
    """

    task: str
    subject: str
    task_id: str
    worker: str
    pid: int
    start: float
    end: float

    @property
    def node(self) -> str:
        """The worker's short name: ``"worker-a"`` for ``"worker-a@host"``."""
        return self.worker.split("@", 1)[0]

    def to_json(self) -> str:
        """The run as one JSON object."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Run:
        """The run :meth:`to_json` wrote."""
        return cls(**json.loads(text))


class Recorder:
    """Reads and writes the example's records under ``namespace`` in Redis."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.runs_key = f"{namespace}:runs"
        self.events_key = f"{namespace}:events"

    def now(self) -> float:
        """Redis server time, epoch seconds."""
        seconds, micros = self.client.time()
        return int(seconds) + int(micros) / 1e6

    @contextmanager
    def run(self, subject: str) -> Iterator[None]:
        """Record the enclosed task body as one :class:`Run` of ``subject``."""
        request = current_task.request
        start = self.now()
        try:
            yield
        finally:
            run = Run(
                task=short_name(current_task.name),
                subject=subject,
                task_id=str(request.id),
                worker=str(request.hostname),
                pid=os.getpid(),
                start=start,
                end=self.now(),
            )
            self.client.rpush(self.runs_key, run.to_json())

    def count(self, task: Any, event: str) -> None:
        """Add one to the counter of ``event`` for ``task`` (a task or its name)."""
        name = short_name(task if isinstance(task, str) else task.name)
        self.client.hincrby(self.events_key, f"{name}:{event}", 1)

    def runs(self) -> list[Run]:
        """Every run recorded so far, in the order they ended."""
        return [Run.from_json(raw) for raw in self.client.lrange(self.runs_key, 0, -1)]

    def events(self) -> dict[str, int]:
        """Every counter: ``{"<task>:<event>": count}``."""
        raw = self.client.hgetall(self.events_key)
        return {_text(key): int(value) for key, value in raw.items()}


def short_name(task_name: str) -> str:
    """``"sync_user"`` for ``"example_project.app.sync_user"``."""
    return task_name.rsplit(".", 1)[-1]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
