"""After a blip of the lock Redis that lost its data: how soon does it take new work?

Run from the repository root (about a minute per row)::

    python benchmarks/bench_restart_grace.py                  # lock_ttl 30 s, blip 10 s
    python benchmarks/bench_restart_grace.py --ttl 12 --blip 3

A private ``redis-server`` holds the broker and results, a second one the locks. One
``celery worker`` (prefork, 4 processes) runs a singleton task and a bounded task
(``concurrency_limit=2``) that hold their lock and one permit for the whole
measurement, renewing them. The lock Redis is SIGKILLed, and started again **empty**
``--blip`` seconds later. From the moment it answers a PING again (``t0``):

* **singleton delay()**: ``probe.delay(i)`` of a singleton whose lock nobody holds, every
  50 ms, until one is accepted (within the restart grace it raises ``RedisRestarting``);
* **bounded start**: 3 short runs of the bounded pool are sent at ``t0``; the first to
  start (the pool has one free permit, held by a placeholder during the grace);
* **put back**: when the two holders' renewals put their lease and permit back (the
  guarantee the grace protects: no newcomer may get them before);
* the peak of concurrent runs of the pool (must be <= 2) and whether a second copy of
  the singleton ever ran beside the holder (must be no).

One row per ``redislock_restart_grace``: ``lock_ttl`` seconds (the default before #29
item 4) and ``True`` (the default: one renewal period plus a margin, see
``core/restart.py``). Quote the numbers with ``cat /proc/loadavg``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import parse_args
from celery_redislock import RedisLock
from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.errors import RedisRestarting
from celery_redislock.testing import RedisServer

APP = """
import json, os, time
from celery import Celery
from celery_redislock import bounded_task, singleton_task

app = Celery("grace", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(
    redislock_url={locks!r},
    redislock_prefix="bench",
    redislock_restart_grace={grace!r},
    redislock_client_options={{"socket_timeout": 2, "socket_connect_timeout": 1}},
    task_default_queue={queue!r},
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
EVENTS = {events!r}


def note(kind, **fields):
    with open(EVENTS, "a") as out:
        out.write(json.dumps({{"kind": kind, "t": time.time(), **fields}}) + "\\n")


@singleton_task(app=app, lock_ttl={ttl}, on_duplicate="raise")
def hold(seconds):
    note("hold-start")
    time.sleep(seconds)
    note("hold-end")


@singleton_task(app=app, lock_ttl={ttl}, on_duplicate="raise")
def probe(i):
    note("probe", i=i)


@bounded_task(app=app, concurrency_limit=2, concurrency_key="api", lock_ttl={ttl})
def pool(seconds, tag):
    note("pool-start", tag=tag)
    time.sleep(seconds)
    note("pool-end", tag=tag)
"""


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _peak(events: list[dict[str, Any]]) -> int:
    edges = sorted(
        (e["t"], 1 if e["kind"] == "pool-start" else -1)
        for e in events
        if e["kind"] in ("pool-start", "pool-end")
    )
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def measure(grace: object, ttl: float, blip: float, workdir: Path) -> dict[str, Any]:
    """One scenario (see the module); the times in seconds after the lock Redis answered."""
    with RedisServer() as broker_server, RedisServer() as lock_server:
        events = workdir / f"events-{uuid.uuid4().hex[:6]}.jsonl"
        name = f"grace_app_{uuid.uuid4().hex[:8]}"
        (workdir / f"{name}.py").write_text(
            textwrap.dedent(
                APP.format(
                    broker=f"{broker_server.url.rsplit('/', 1)[0]}/1",
                    backend=f"{broker_server.url.rsplit('/', 1)[0]}/2",
                    locks=lock_server.url,
                    grace=grace,
                    ttl=ttl,
                    queue=f"q-{name}",
                    events=str(events),
                )
            )
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), *sys.path])}
        log = workdir / f"{name}.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    f"{name}:app",
                    "worker",
                    "-P",
                    "prefork",
                    "-c",
                    "4",
                    "-l",
                    "info",
                    "--without-heartbeat",
                    "--without-gossip",
                    "--without-mingle",
                ],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            sys.path.insert(0, str(workdir))
            tasks = __import__(name)
            locks = redis.Redis.from_url(lock_server.url, socket_timeout=1)
            _wait(lambda: " ready." in log.read_text(errors="replace"), 60, "the worker")
            held = ttl * 1.5 + blip + 10
            tasks.hold.delay(held)
            lock = RedisLock(locks, tasks.hold.singleton_key(held), prefix="bench")
            sem = ParkingSemaphore(locks, "api", limit=2, prefix="bench")
            tasks.pool.delay(held, "holder")
            _wait(
                lambda: {"hold-start", "pool-start"} <= {e["kind"] for e in _events(events)},
                30,
                "both holders running",
            )
            time.sleep(min(ttl / 3, 2.0))  # renewed at least once? not needed; settle
            lock_server.kill()
            time.sleep(blip)
            lock_server.start()
            _wait(lambda: _pings(locks), 30, "the lock Redis answering")
            t0 = time.time()
            for i in range(3):
                tasks.pool.delay(0.2, f"new{i}")
            singleton_at = put_back = None
            i = 0
            deadline = time.monotonic() + ttl * 2 + 30
            while time.monotonic() < deadline:
                if singleton_at is None:
                    try:
                        tasks.probe.delay(i)
                        singleton_at = time.time() - t0
                    except RedisRestarting:
                        i += 1
                if put_back is None and _put_back(lock, sem):
                    put_back = time.time() - t0
                starts = [
                    e["t"]
                    for e in _events(events)
                    if e["kind"] == "pool-start" and e.get("tag", "").startswith("new")
                ]
                if singleton_at is not None and put_back is not None and starts:
                    break
                time.sleep(0.05)
            worker_log = log.read_text(errors="replace")
            done = _events(events)
            return {
                "grace": grace,
                "singleton_delay": singleton_at,
                "bounded_start": (min(starts) - t0) if starts else None,
                "put_back": put_back,
                "peak": _peak(done),
                "lost": worker_log.count("lost its singleton lock")
                + worker_log.count("lost its permit"),
                "holds": sum(e["kind"] == "hold-start" for e in done),
            }
        finally:
            worker.terminate()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
                worker.wait(5)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _put_back(lock: RedisLock, pool: ParkingSemaphore) -> bool:
    """Both holders' leases are in the restarted Redis again (not placeholders)."""
    try:
        lock_info, pool_info = lock.info(), pool.info()
    except redis.RedisError:
        return False
    real = [h for h in pool_info.holders if not h.token_hint.startswith("~restart")]
    return lock_info.held and bool(real)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ttl", type=float, default=30.0, help="lock_ttl (s)")
    parser.add_argument("--blip", type=float, default=10.0, help="seconds the lock Redis is down")
    parser.add_argument("--only", choices=("before", "after"), help="one row only")
    args = parse_args(parser)
    rows = []
    graces: list[tuple[str, object]] = [("lock_ttl (before)", args.ttl), ("True (after)", True)]
    with tempfile.TemporaryDirectory() as tmp:
        for label, grace in graces:
            if args.only and args.only not in label:
                continue
            result = measure(grace, args.ttl, args.blip, Path(tmp))
            rows.append((label, result))
            print(label, result, flush=True)
    print(f"\nlock_ttl {args.ttl:g} s, blip {args.blip:g} s; loadavg {_loadavg()}")
    print(
        f"{'restart_grace':<20} {'delay() ok':>11} {'bounded start':>14} {'put back':>9} "
        f"{'peak':>5} {'lost':>5}"
    )
    for label, r in rows:
        print(
            f"{label:<20} {_s(r['singleton_delay']):>11} {_s(r['bounded_start']):>14} "
            f"{_s(r['put_back']):>9} {r['peak']:>5} {r['lost']:>5}"
        )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
