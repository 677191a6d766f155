"""Worker kills: bounded (parked) tasks lost beside plain Celery tasks, in one run.

Run from the repository root (about a minute per round)::

    python benchmarks/bench_worker_kill.py                 # 300 + 300 tasks, limit 3
    python benchmarks/bench_worker_kill.py --rounds 3 --tasks 300

A private ``redis-server`` holds the broker, results and locks. 4 ``celery worker``
subprocesses (prefork, 4 processes each, default prefetch) consume the default queue,
which carries both kinds:

* **bounded**: ``@bounded_task(concurrency_limit=3)`` (parking, the default), all sent
  at once: most are parked in Redis and published again one by one;
* **plain**: the same body as a plain Celery task, sent at a steady rate over the same
  time, so the kills meet both alike.

Every ``--interval`` seconds (5) a random worker's **main process** is SIGKILLed (its
pool children die with it or finish their task and exit) and a fresh worker takes its
place. Every run appends ``"<start> <end> <task id>"`` to a file. When everything that
can still run has run (nothing new for ``lock_ttl`` + 5 s), the table shows per kind:
tasks sent, ran, lost (never ran), ran twice, the peak concurrency of the bounded
runs (interval sweep: must be <= the limit), and, for bounded, the permits and parked
entries left in Redis (must be 0).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis
from _common import print_table

from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.testing import RedisServer

APP = '''
import time
from celery import Celery
from celery_redislock import bounded_task

app = Celery("bench_kill", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False)


def _body(kind, seconds):
    start = time.time()
    time.sleep(seconds)
    from celery import current_task
    with open({records!r} + "." + kind, "a") as out:
        out.write(f"{{start}} {{time.time()}} {{current_task.request.id}}\\n")


@bounded_task(app=app, name="kill.bounded", concurrency_limit={limit}, concurrency_key="kill",
              lock_ttl={lock_ttl})
def bounded(seconds):
    _body("bounded", seconds)


@app.task(name="kill.plain")
def plain(seconds):
    _body("plain", seconds)
'''


def _start(directory: str, module: str, n: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        directory, os.environ.get("PYTHONPATH")]))}  # fmt: skip
    log = open(os.path.join(directory, f"worker-{n}.log"), "ab")  # noqa: SIM115
    args = [sys.executable, "-m", "celery", "-A", f"{module}:app", "worker", "-P", "prefork",
            "-c", "4", "-n", f"w{n}-{uuid.uuid4().hex[:4]}@%h",
            "-l", "info", "--without-heartbeat", "--without-gossip",
            "--without-mingle"]  # fmt: skip
    process = subprocess.Popen(args, cwd=directory, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    log.close()
    return process


def _runs(path: Path) -> list[tuple[float, float, str]]:
    if not path.exists():
        return []
    rows = (line.split() for line in path.read_text().splitlines() if line.strip())
    return [(float(s), float(e), t) for s, e, t in rows]


def _peak(runs: list[tuple[float, float, str]]) -> int:
    events = sorted([(s, 1) for s, _, _ in runs] + [(e, -1) for _, e, _ in runs])
    current = best = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def one_round(count: int, seconds: float, limit: int, interval: float,
              lock_ttl: float) -> dict[str, Any]:  # fmt: skip
    with RedisServer() as server, tempfile.TemporaryDirectory() as directory:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_kill_{uuid.uuid4().hex[:8]}"
        records = os.path.join(directory, "runs")
        Path(directory, f"{module}.py").write_text(textwrap.dedent(APP.format(
            broker=f"{base}/1", backend=f"{base}/2", locks=f"{base}/3", records=records,
            limit=limit, lock_ttl=lock_ttl)), encoding="utf-8")  # fmt: skip
        sys.path.insert(0, directory)
        tasks = __import__(module)
        workers = [_start(directory, module, n) for n in range(4)]
        every = list(workers)  # killed ones too: their orphaned children are ended last
        started = 4
        time.sleep(6)  # the workers come up
        bounded = [tasks.bounded.delay(seconds).id for _ in range(count)]
        plain: list[str] = []
        drain = count * seconds / limit
        t0 = next_kill = time.monotonic()
        next_kill += interval * random.uniform(0.8, 1.2)
        kills = 0
        while time.monotonic() - t0 < drain or len(plain) < count:
            due = int(count * min(1.0, (time.monotonic() - t0) / drain))
            while len(plain) < due:
                plain.append(tasks.plain.delay(seconds).id)
            if time.monotonic() >= next_kill:
                victim = random.randrange(len(workers))
                os.kill(workers[victim].pid, signal.SIGKILL)
                workers[victim].wait(5)
                kills += 1
                workers[victim] = _start(directory, module, started)
                every.append(workers[victim])
                started += 1
                next_kill += interval * random.uniform(0.8, 1.2)
            time.sleep(0.02)
        # Until nothing new has run for a while (lapsed reservations come back after
        # lock_ttl; the sweepers then publish them).
        paths = {k: Path(f"{records}.{k}") for k in ("bounded", "plain")}
        last, seen = time.monotonic(), -1
        while time.monotonic() - last < lock_ttl + 5:
            now = sum(len(_runs(p)) for p in paths.values())
            if now != seen:
                seen, last = now, time.monotonic()
            time.sleep(0.5)
        locks = redis.Redis.from_url(f"{base}/3")
        sem = ParkingSemaphore(locks, "kill", limit=limit)
        info, permits = sem.parking_info(), len(sem.info().holders)
        for process in workers:
            process.terminate()
        for process in workers:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for process in every:  # each worker's process group: orphaned pool children
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        result: dict[str, Any] = {"kills": kills}
        for kind, sent in (("bounded", bounded), ("plain", plain)):
            runs = _runs(paths[kind])
            ran = Counter(t for _, _, t in runs)
            result[kind] = {
                "sent": len(sent), "ran": len(ran), "lost": len(set(sent) - set(ran)),
                "twice": sum(1 for n in ran.values() if n > 1), "peak": _peak(runs),
            }
        result["bounded"]["left"] = f"{permits} permits, {info.parked + info.claimed} parked"
        result["plain"]["left"] = "-"
        locks.close()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks of each kind")
    parser.add_argument("--duration", type=float, default=0.2, help="seconds each task sleeps")
    parser.add_argument("--limit", type=int, default=3, help="concurrency_limit")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--lock-ttl", type=float, default=10.0, help="lock_ttl of the task")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for n in range(args.rounds):
        r = one_round(args.tasks, args.duration, args.limit, args.interval, args.lock_ttl)
        for kind in ("bounded", "plain"):
            k = r[kind]
            rows.append([f"#{n + 1} {kind}", r["kills"], k["sent"], k["ran"], k["lost"],
                         k["twice"], k["peak"], k["left"]])  # fmt: skip
    print(f"{args.tasks} bounded (limit {args.limit}, parked) + {args.tasks} plain tasks of "
          f"{args.duration * 1000:g} ms, 4 workers x 4 (prefork), a random worker main "
          f"process SIGKILLed every ~{args.interval:g}s and replaced; lock_ttl "
          f"{args.lock_ttl:g}s\n")
    print_table(["round", "kills", "sent", "ran", "lost", "ran twice", "peak", "left in Redis"],
                rows)  # fmt: skip
    print(f"\npython {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
