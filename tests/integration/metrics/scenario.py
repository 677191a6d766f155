"""Counts exact under prefork (#27): real ``celery worker`` processes run singleton,
bounded and rate-limited tasks with duplicates and SIGKILLed pool processes; every
counter in Redis must equal what the scenario recorded itself. Used by
``test_prefork.py`` (short) and ``benchmarks/bench_metrics_exact.py`` (4 workers x 4
processes, 2,000 tasks).

What the scenario records, independently of the counters:

* at enqueue, in this process: a call whose result carries the id it was sent with was
  granted its singleton lock; one that came back with another id was refused;
* the runs parked for the pool's permit and for the rate (``permit_parked``,
  ``rate_limited``: synchronous receivers in the workers, pushing to Redis);
* in the task bodies: ``start`` and ``end`` markers (task id and pid) pushed to Redis
  synchronously, so a run killed in its body has a start and no end;
* the pool processes it SIGKILLed, while they waited in a body (for nothing), from
  0.1 s after the run started: the recorder may lose the last 0.02 s of a killed
  process's events (``metrics.recorder.SPACING``), not older ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from celery_redislock.celery.metrics.read import read_counters

from ..workers import LOCKS_DB, AppModule, WorkerProcess, db_url, side_by_side

BODY = """
from celery_redislock import bounded_task, rate_limited_task

marks = redis.Redis.from_url(app.conf.redislock_url)

from celery_redislock.celery.signals import permit_parked, rate_limited

@permit_parked.connect(weak=False)
def _parked(sender=None, task_id=None, **kwargs):
    marks.rpush("marks:parked", str(task_id))

@rate_limited.connect(weak=False)
def _rate_parked(sender=None, task_id=None, **kwargs):
    marks.rpush("marks:rate_parked", str(task_id))

def _mark(kind, what, task_id):
    marks.rpush(f"marks:{kind}:{what}", f"{task_id} {os.getpid()}")

def _pause(seconds, task_id):
    if seconds == KILL:  # to be killed here: wait for nothing, until it comes
        # Offered for killing once the run's own events are out of the recorder's
        # spacing (0.02 s: what a SIGKILL may lose, see metrics/recorder.py).
        time.sleep(0.1)
        marks.set(f"pid:{task_id}", os.getpid())
        marks.blpop("never", 120)
    else:
        time.sleep(seconds)

KILL = -1

@app.task(base=SingletonTask, bind=True, unique_on=("n",))
def single(self, n, pause):
    _mark("single", "start", self.request.id)
    _pause(pause, self.request.id)
    _mark("single", "end", self.request.id)
    return n

@bounded_task(app=app, bind=True, concurrency_limit=3, concurrency_key="pool-x",
              concurrency_wait=0)
def bounded(self, n, pause):
    _mark("bounded", "start", self.request.id)
    _pause(pause, self.request.id)
    _mark("bounded", "end", self.request.id)
    return n

@rate_limited_task(app=app, bind=True, global_rate_limit=RATE, global_rate_key="api-x")
def rated(self, n):
    _mark("rated", "start", self.request.id)
    _mark("rated", "end", self.request.id)
    return n
"""

KILL = -1
"""The pause of a run chosen to be killed: it blocks in its body until killed (the
others sleep 0-20 ms)."""


@dataclass
class Outcome:
    """What the scenario recorded and what the counters say."""

    expected: dict[tuple[str, str, str], int]
    counted: dict[tuple[str, str, str], int]
    killed: int
    seconds: float


def _marks(client: redis.Redis, kind: str, what: str) -> set[str]:
    return {m.decode().split()[0] for m in client.lrange(f"marks:{kind}:{what}", 0, -1)}


def run(
    tmp_path: Path,
    redis_url: str,
    *,
    workers: int,
    processes: int,
    tasks: int,
    kills: int,
    timeout: float = 300.0,
) -> Outcome:
    """Run the scenario; ``tasks`` calls, half singleton (keys repeat: duplicates),
    half bounded; ``kills`` runs of each kind killed in their body; then ``tasks // 4``
    rate-limited calls at once, at ``tasks // 8`` per second: about half of them
    parked for their admission (none killed: a killed admitted run would be charged
    and counted, neither started nor ended by the record)."""
    started = time.monotonic()
    locks = redis.Redis.from_url(db_url(redis_url, LOCKS_DB))
    locks.flushdb()
    rate = f"{max(2, tasks // 8)}/s"
    body = f"RATE = {rate!r}\n{BODY}"
    module = AppModule(tmp_path, redis_url, body, conf="{'redislock_metrics': True}")
    app_module = module.load()
    pool = [WorkerProcess(module, concurrency=processes, name=f"m{i}") for i in range(workers)]
    with side_by_side(*pool):
        granted = refused = 0
        sent: list[Any] = []
        to_kill = {"single": kills, "bounded": kills}
        killing: list[tuple[str, str]] = []
        for i in range(tasks):
            kind = "single" if i % 2 == 0 else "bounded"
            kill = to_kill[kind] > 0 and i % 7 == 1 + (kind == "single")
            pause = KILL if kill else (i % 3) * 0.01
            task_id = str(uuid.uuid4())
            if kind == "single":
                result = app_module.single.apply_async((i // 2 % 9, pause), task_id=task_id)
                if result.id == task_id:
                    granted += 1
                else:
                    refused += 1
                    continue
            else:
                result = app_module.bounded.apply_async((i, pause), task_id=task_id)
            sent.append(result)
            if kill:
                to_kill[kind] -= 1
                killing.append((kind, task_id))
        sent += [app_module.rated.delay(i) for i in range(tasks // 4)]
        killed = _kill_in_body(locks, pool, killing, timeout)
        dead = set().union(*killed.values())
        for result in sent:
            if result.id not in dead:  # a killed run's failure is stored by its worker
                result.get(timeout=timeout, propagate=False)
        expected = _expected(locks, app_module, granted, refused, killed)
        counted = _settle(locks, expected, timeout=30)
    locks.close()
    return Outcome(
        expected, counted, sum(len(v) for v in killed.values()), time.monotonic() - started
    )


def _kill_in_body(
    locks: redis.Redis, pool: list[WorkerProcess], killing: list[tuple[str, str]], timeout: float
) -> dict[str, set[str]]:
    """SIGKILL the pool process of each run in ``killing`` while it sleeps in its body."""
    killed: dict[str, set[str]] = {"single": set(), "bounded": set(), "rated": set()}
    deadline = time.monotonic() + timeout
    waiting = list(killing)
    while waiting and time.monotonic() < deadline:
        # Read afresh each time: a killed pool process is replaced by a new one.
        children = {pid for w in pool for pid in w.child_pids()}
        for kind, task_id in list(waiting):
            pid = locks.get(f"pid:{task_id}")
            if pid is not None and int(pid) in children:  # only our workers' children
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
                killed[kind].add(task_id)
                waiting.remove((kind, task_id))
        time.sleep(0.02)
    assert not waiting, f"runs never started: {waiting}"
    return killed


def _expected(
    locks: redis.Redis,
    app_module: Any,
    granted: int,
    refused: int,
    killed: dict[str, set[str]],
) -> dict[tuple[str, str, str], int]:
    single = app_module.single.name
    kinds = ("single", "bounded", "rated")
    ends = {kind: _marks(locks, kind, "end") for kind in kinds}
    starts = {kind: _marks(locks, kind, "start") for kind in kinds}
    for kind in kinds:
        assert not (killed[kind] & ends[kind]), f"a killed {kind} run ended"
        assert starts[kind] == ends[kind] | killed[kind], (
            f"{kind}: runs that neither ended nor died"
        )
    parked = len(locks.lrange("marks:parked", 0, -1))
    rate_parked = len(locks.lrange("marks:rate_parked", 0, -1))
    return {
        ("lock", single, "granted"): granted,
        ("lock", single, "refused_duplicate"): refused,
        ("lock", single, "released"): len(ends["single"]),
        ("lock", single, "reclaimed"): len(killed["single"]),
        ("semaphore", "pool-x", "grants"): len(starts["bounded"]),
        ("semaphore", "pool-x", "released"): len(ends["bounded"]),
        ("semaphore", "pool-x", "reclaimed"): len(killed["bounded"]),
        ("parking", "pool-x", "parked"): parked,
        # Every rate-parked run started once, on the admission its claim reserved;
        # the others were admitted at once.
        ("ratelimit", "api-x", "rate_limited"): rate_parked,
        ("ratelimit", "api-x", "handed_off"): rate_parked,
        ("ratelimit", "api-x", "granted"): len(starts["rated"]) - rate_parked,
    }


_GRANTS = ("granted", "granted_after_wait", "handed_off")


def _counted(locks: redis.Redis) -> dict[tuple[str, str, str], int]:
    counted: dict[tuple[str, str, str], int] = {}
    for c in read_counters(locks, "redislock"):
        for outcome, n in c.counts.items():
            key = "grants" if c.kind == "semaphore" and outcome in _GRANTS else outcome
            counted[c.kind, c.name, key] = counted.get((c.kind, c.name, key), 0) + n
    return counted


def _settle(
    locks: redis.Redis, expected: dict[tuple[str, str, str], int], timeout: float
) -> dict[tuple[str, str, str], int]:
    """The counters once they match (the processes' recorders send within ms)."""
    deadline = time.monotonic() + timeout
    while True:
        counted = _counted(locks)
        view = {k: counted.get(k, 0) for k in expected}
        if view == expected or time.monotonic() > deadline:
            return counted
        time.sleep(0.2)
