"""Benchmark a singleton task's ``delay`` -> result round trip against a plain task's.

Run from the repository root (well under a minute)::

    python benchmarks/bench_singleton.py              # 400 calls of each
    python benchmarks/bench_singleton.py --calls 100  # shorter, for a smoke test

It starts a private ``redis-server`` (``celery_redislock.testing.RedisServer``) that
holds the broker (db 1), the result backend (db 2) and the locks (db 3), and one
in-process worker (``celery.contrib.testing.worker.start_worker``) consuming both
tasks. The tasks have the same trivial body; one is a plain ``@app.task``, one a
``SingletonTask`` (default mode ``until_done``: lock at enqueue, adoption and renewal
at start, release before the result is stored), always called with the same
argument, as a "refresh X" task is.

Two more tasks split the singleton's cost. One is a plain task that makes the
lifecycle's three synchronous round trips to the lock's Redis and nothing else (a
``PING`` before publishing, one as the run starts, one as it ends): what no design
with a lock taken at enqueue and checked at start can avoid. The other runs the
singleton's own three scripts through the core API with no Celery glue around them
(``RedisLock.try_acquire`` before publishing, ``adopt`` with renewal as the run
starts, ``release`` as it ends): the scripts' cost; the singleton's remainder is the
glue (keys, options, headers, signals, guards).

Calls are **interleaved** (the order rotating every round) and sequential, so drift
and warm-up hit all alike. Reported: p50 / p90 / p99 of each, the ratios of the
medians to the plain task's (the issue's target for the singleton: within 1.2x), and
the Redis commands per call (``INFO commandstats`` delta on the shared server, so it
counts the broker's and the backend's commands too).

The figures depend on the machine: run it on an otherwise idle one (the load average
is printed at the end).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis
from _common import command_calls, median, parse_args, percentile, print_table, us
from celery import Celery, Task
from celery.contrib.testing.worker import start_worker

from celery_redislock import RedisLock, SingletonTask
from celery_redislock.testing import RedisServer


def make_app(base: str) -> Celery:
    app = Celery("bench_singleton", set_as_current=False)
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{base}/2",
        redislock_url=f"{base}/3",
        task_default_queue="bench-singleton",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    return app


def run(calls: int, pool: str) -> None:
    with RedisServer() as server:
        base = server.url.rsplit("/", 1)[0]
        app = make_app(base)

        @app.task(name="bench.plain", shared=False)
        def plain(key: str) -> str:
            return key

        @app.task(name="bench.singleton", base=SingletonTask, shared=False)
        def single(key: str) -> str:
            return key

        locks = redis.Redis.from_url(f"{base}/3")

        class ThreeTrips(Task):  # type: ignore[type-arg]
            def apply_async(self, *args: Any, **kwargs: Any) -> Any:
                locks.ping()  # where the singleton takes its lock
                return super().apply_async(*args, **kwargs)

        @app.task(name="bench.three-trips", base=ThreeTrips, shared=False)
        def three_trips(key: str) -> str:
            locks.ping()  # where the singleton adopts its lock
            try:
                return key
            finally:
                locks.ping()  # where it releases it

        bare_lock = RedisLock(locks, "bench.bare-scripts:user-42", ttl=30)

        class BareScripts(Task):  # type: ignore[type-arg]
            def apply_async(self, *args: Any, **kwargs: Any) -> Any:
                lease, _ = bare_lock.try_acquire(owner="queued", ttl=3600)
                assert lease is not None
                return super().apply_async(*args, headers={"token": lease.token}, **kwargs)

            def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
                lease = bare_lock.adopt(
                    self.request.token,
                    new_token=f"{task_id}.run",
                    owner="running",
                    ttl=30,
                    renew=True,
                )
                assert lease is not None
                self.request.bare_lease = lease

        @app.task(name="bench.bare-scripts", base=BareScripts, shared=False)
        def bare_scripts(key: str) -> str:
            try:
                return key
            finally:
                bare_scripts.request.bare_lease.release()

        admin = redis.Redis.from_url(f"{base}/0")
        with start_worker(
            app, pool=pool, concurrency=1, perform_ping_check=False, loglevel="WARNING"
        ):
            tasks: list[tuple[str, Any]] = [
                ("plain", plain),
                ("singleton", single),
                ("plain + 3 round trips", three_trips),
                ("plain + the 3 scripts, bare", bare_scripts),
            ]
            for _, task in tasks * 20:  # warm-up: connections, scripts
                task.delay("user-42").get(timeout=10)
            times: dict[str, list[float]] = {label: [] for label, _ in tasks}
            commands = dict.fromkeys(times, 0)
            for i in range(calls):
                turn = i % len(tasks)
                for label, task in tasks[turn:] + tasks[:turn]:
                    before = command_calls(admin)
                    start = time.perf_counter()
                    assert task.delay("user-42").get(timeout=10) == "user-42"
                    times[label].append(time.perf_counter() - start)
                    commands[label] += command_calls(admin) - before - 1  # INFO itself
        admin.close()
        locks.close()
        app.close()

    rows = []
    plain_p50 = median(times["plain"])
    for label, values in times.items():
        rows.append(
            [
                label,
                len(values),
                us(percentile(values, 50)),
                us(percentile(values, 90)),
                us(percentile(values, 99)),
                f"{median(values) / plain_p50:.3f}x",
                f"{commands[label] / calls:.1f}",
            ]
        )
    print(f"delay -> result round trip, {pool} pool, {calls} interleaved calls of each\n")
    print_table(
        ["task", "calls", "p50 us", "p90 us", "p99 us", "p50 / plain", "Redis cmds/call"], rows
    )
    ratio = median(times["singleton"]) / plain_p50
    print(f"\nsingleton / plain, ratio of medians: {ratio:.3f} (target <= 1.2)")
    print(
        f"python {platform.python_version()}, {platform.machine()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls of each task")
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    args = parse_args(parser)
    run(args.calls, args.pool)


if __name__ == "__main__":
    main()
