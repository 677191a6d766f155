"""Hand-off stage timestamps for ``bench_bounded.py --backlog --stages`` (benchmark only).

Installed into the workers' app (``install(app, directory)``), it wraps a few
functions of Celery, kombu and this package, in place and only in the benchmark's
worker processes, to stamp each hand-off of a parked run: the release in the pool
process that ran the previous one, the publish, the worker's main process reading the
message from the broker and sending it to a pool process, and the run taking its
reserved permit. Each process appends ``"<task id> <stage> <epoch s>"`` lines to a
file of its own (a line-buffered write: no Redis call added to the path measured);
:func:`report` reads them back and prints the per-stage medians and p99s.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

STAGES = (
    # (from, to, what happens in between)
    ("release", "claimed", "child: park_release.lua (frees the permit, claims the head)"),
    ("claimed", "publish", "child: decode the parked message"),
    ("publish", "published", "child: app.send_task (kombu producer, LPUSH)"),
    ("published", "read", "main reads the BRPOP reply (< 0: before send_task returned)"),
    ("read", "received", "main: kombu + Celery strategy (task_received)"),
    ("received", "dispatch", "main: to the pool (timer/bucket)"),
    ("dispatch", "dispatched", "main: execute_using_pool (intake check, pipe write)"),
    ("dispatched", "prerun", "pipe -> pool process picks it up, trace set-up"),
    ("prerun", "take", "child: before_start up to park_take.lua"),
    ("take", "taken", "child: park_take.lua (takes the reserved permit)"),
    ("taken", "body", "child: the rest of before_start, into the body"),
)

_state = threading.local()
_out: list[Any] = [None, None]  # pid, file
_main = {"read": 0.0}


def stamp(task_id: str, stage: str, at: float | None = None) -> None:
    """Append one stamp to this process's file."""
    if _out[0] != os.getpid():
        _out[0] = os.getpid()
        _out[1] = open(Path(_state_dir(), f"stages-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115
    _out[1].write(f"{task_id} {stage} {time.time() if at is None else at:.6f}\n")


def _state_dir() -> str:
    return os.environ["BENCH_STAGES_DIR"]


def install(app: Any, directory: str) -> None:
    """Wrap the hand-off's functions (in the process that imports the app)."""
    os.environ["BENCH_STAGES_DIR"] = directory
    from celery import signals
    from celery.worker import strategy
    from kombu.transport import redis as kombu_redis

    from celery_redislock.celery.bounded import guard, parking
    from celery_redislock.core import parking as core_parking

    finish = guard.PermitHold.finish

    def timed_finish(self: Any, reason: str) -> None:
        _state.release = time.time()
        try:
            finish(self, reason)
        finally:
            _state.release = None  # a pump's publish (no release) is not stamped

    guard.PermitHold.finish = timed_finish  # type: ignore[method-assign]
    publish_claimed = parking.publish_claimed

    def timed_publish(app_: Any, sem: Any, claimed: Any) -> None:
        _state.claimed = time.time()
        _state.publishing = True
        try:
            publish_claimed(app_, sem, claimed)
        finally:
            _state.publishing = False

    parking.publish_claimed = timed_publish
    send_task = app.send_task

    @functools.wraps(send_task)
    def timed_send(*args: Any, **kwargs: Any) -> Any:
        if not getattr(_state, "publishing", False):
            return send_task(*args, **kwargs)
        start = time.time()
        result = send_task(*args, **kwargs)
        task_id = kwargs.get("task_id")
        if getattr(_state, "release", None) is not None:
            stamp(task_id, "release", _state.release)
        stamp(task_id, "claimed", _state.claimed)
        stamp(task_id, "publish", start)
        stamp(task_id, "published")
        return result

    app.send_task = timed_send
    brpop_read = kombu_redis.Channel._brpop_read

    def timed_read(self: Any, **options: Any) -> Any:
        _main["read"] = time.time()
        return brpop_read(self, **options)

    kombu_redis.Channel._brpop_read = timed_read
    make_request_cls = strategy.create_request_cls

    def timed_request_cls(*args: Any, **kwargs: Any) -> Any:
        # Celery's strategy makes a Request subclass per task type, with its own
        # execute_using_pool (the intake check, then the write to a pool process).
        cls = make_request_cls(*args, **kwargs)
        execute = cls.execute_using_pool

        def timed_execute(self: Any, pool: Any, **options: Any) -> Any:
            stamp(self.id, "dispatch")
            try:
                return execute(self, pool, **options)
            finally:
                stamp(self.id, "dispatched")

        cls.execute_using_pool = timed_execute
        return cls

    strategy.create_request_cls = timed_request_cls
    take = core_parking.ParkingSemaphore.take

    def timed_take(self: Any, entry_id: str, owner: str | None = None, **kwargs: Any) -> Any:
        task_id = (owner or "").split("@")[0]
        stamp(task_id, "take")
        try:
            return take(self, entry_id, owner, **kwargs)
        finally:
            stamp(task_id, "taken")

    core_parking.ParkingSemaphore.take = timed_take  # type: ignore[method-assign]

    def on_received(request: Any, **_: Any) -> None:
        stamp(request.id, "read", _main["read"])
        stamp(request.id, "received")

    def on_prerun(task_id: str, **_: Any) -> None:
        stamp(task_id, "prerun")

    signals.task_received.connect(on_received, weak=False)
    signals.task_prerun.connect(on_prerun, weak=False)


def collect(directory: str) -> dict[str, dict[str, float]]:
    """Every stamp so far: task id -> stage -> epoch seconds (the latest of each, so a
    run parked at intake first shows its last delivery's)."""
    stamps: dict[str, dict[str, float]] = {}
    for path in Path(directory).glob("stages-*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 3:
                stages, at = stamps.setdefault(parts[0], {}), float(parts[2])
                stages[parts[1]] = max(at, stages.get(parts[1], at))  # the last delivery's
    return stamps


def report(stamps: dict[str, dict[str, float]], task_ids: set[str]) -> list[list[str]]:
    """Rows ``[stage, what, p50 ms, p99 ms, n]`` over the hand-offs of ``task_ids``
    that have every stamp (a run published by a release), and the total."""
    from _common import percentile  # the benchmark's side only (not in the workers)

    handed = [
        s
        for t, s in stamps.items()
        if t in task_ids and all(a in s and b in s for a, b, _ in STAGES)
    ]
    rows = []
    for a, b, what in (*STAGES, ("release", "body", "the whole hand-off")):
        values = [(s[b] - s[a]) * 1000 for s in handed]
        if len(values) >= 2:
            rows.append(
                [
                    f"{a} -> {b}",
                    what,
                    f"{percentile(values, 50):.2f}",
                    f"{percentile(values, 99):.2f}",
                    str(len(values)),
                ]
            )
    return rows
