"""Real ``celery beat`` processes and the worker that counts what they sent.

``beat_module(tmp_path, redis_url, ...)`` writes an app whose ``beat_tick`` task
records every run it gets into the list ``RUNS:<module name>`` of the locks database: the entry,
the slot and the sending beat from the message headers (``LeaderScheduler`` stamps
them), and the time it ran. ``BeatProcess`` runs ``celery beat`` on it; each beat
reads ``BEAT_LOCK_URL`` from its environment (so one can reach Redis through a
fault proxy) and keeps its schedule file apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from ..workers import LOCKS_DB, AppModule, CeleryProcess, db_url, module_env

__all__ = ["RUNS", "BeatProcess", "Run", "beat_module", "module_env", "runs", "wait_for"]

RUNS = "beat-runs"

_BODY = """
import json

@app.task(bind=True, name="beat_tick")
def beat_tick(self, entry):
    request = self.request
    locks.rpush(RUNS, json.dumps([
        entry,
        request.get("redislock_beat_slot"),
        request.get("redislock_beat_sender"),
        time.time(),
    ]))
"""


def beat_module(
    directory: Path,
    redis_url: str,
    *,
    schedule: str,
    conf: str = "{}",
    prelude: str = "",
) -> AppModule:
    """An app with the ``beat_tick`` task and ``schedule`` (Python source of a dict
    of beat entries, e.g. ``{"every-second": {"task": "beat_tick", "schedule": 1.0,
    "args": ("every-second",)}}``); ``prelude`` is source run before the task is
    defined (e.g. Django's setup)."""
    body = (
        prelude
        + _BODY
        + "\nfrom celery.schedules import crontab\n"
        + f"app.conf.beat_schedule = {schedule}\n"
        + "app.conf.redislock_url = os.environ.get('BEAT_LOCK_URL', app.conf.redislock_url)\n"
        # Each module its own beat group and list of runs: tests share the Redis.
        + "if app.conf.get('redislock_beat_group') is None:\n"
        + "    app.conf.redislock_beat_group = app.main\n"
        + f"RUNS = {RUNS!r} + ':' + app.main\n"
    )
    return AppModule(directory, redis_url, body, conf=conf)


@dataclass(frozen=True)
class Run:
    """One run of ``beat_tick``: the entry, its slot (epoch s; None from plain Celery),
    the beat that sent it (its owner id) and when the worker ran it."""

    entry: str
    slot: float | None
    sender: str | None
    ran_at: float


def runs(module: AppModule, redis_url: str) -> list[Run]:
    """Every run of ``module``'s beats so far, in the order the worker ran them."""
    client = redis.Redis.from_url(db_url(redis_url, LOCKS_DB))
    try:
        raw = client.lrange(f"{RUNS}:{module.name}", 0, -1)
    finally:
        client.close()
    out = []
    for item in raw:
        entry, slot, sender, ran_at = json.loads(item)
        when = None
        if slot is not None:
            from datetime import datetime

            when = datetime.fromisoformat(slot).timestamp()
        out.append(Run(entry, when, sender, ran_at))
    return out


class BeatProcess(CeleryProcess):
    """``celery -A <module> beat`` in a subprocess (its own session); a context manager."""

    def __init__(
        self,
        module: AppModule,
        *,
        scheduler: str = "celery_redislock.beat:LeaderScheduler",
        lock_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        tag = uuid.uuid4().hex[:6]
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            f"{module.name}:app",
            "beat",
            "-S",
            scheduler,
            "-s",
            str(module.directory / f"schedule-{tag}"),
            "--pidfile=",
            "-l",
            "info",
        ]
        super().__init__(module, module.directory / f"beat-{tag}.log", args)
        self.lock_url = lock_url
        self.env = env or {}

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> BeatProcess:
        env = module_env(self.module)
        if self.lock_url is not None:
            env["BEAT_LOCK_URL"] = self.lock_url
        env.update(self.env)
        self.launch(env)
        return self

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it does not end."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            os.kill(process.pid, signal.SIGCONT)  # a paused beat cannot shut down
            process.terminate()
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5)


def wait_for(predicate: object, timeout: float, what: str) -> None:
    """Poll ``predicate()`` until true; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
