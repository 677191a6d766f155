"""The semaphore obeys each waiter's own limit (issue 13, item 3).

A release hands freed permits straight to queued waiters; it used to grant them under
the stored limit of whoever acquired last, so one acquire+release by a client with
``limit=10`` granted four queued ``limit=2`` waiters: six live permits. Waiters here
are SIGSTOPped processes (queued, listening, unable to ask for anything themselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import redis

from celery_redislock import RedisSemaphore

_WAITER = """
import sys, redis
from celery_redislock import RedisSemaphore
sem = RedisSemaphore(redis.Redis.from_url(sys.argv[1]), "pool", limit=2, ttl=30)
print("waiting", flush=True)
sem.acquire(timeout=60)
print("granted", flush=True)
"""


def test_a_release_grants_queued_waiters_under_their_own_limit(
    r: redis.Redis, redis_url: str
) -> None:
    low = RedisSemaphore(r, "pool", limit=2, ttl=30)
    held = [low.acquire(), low.acquire()]
    assert all(held)
    waiters = [
        subprocess.Popen([sys.executable, "-c", _WAITER, redis_url], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    try:
        for proc in waiters:
            assert proc.stdout is not None and proc.stdout.readline() == b"waiting\n"
        deadline = time.monotonic() + 10
        while r.zcard(low.keys.queue) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.zcard(low.keys.queue) == 4
        time.sleep(0.3)  # every waiter has just checked in: all are fresh
        for proc in waiters:
            os.kill(proc.pid, signal.SIGSTOP)
        high = RedisSemaphore(r, "pool", limit=10, ttl=30)
        lease = high.acquire(blocking=False)  # its own limit allows a third
        assert lease is not None and lease.release()
        # Before: the release granted all four waiters under limit 10: six live.
        assert r.zcard(low.keys.holders) == 2
        assert held[0] is not None and held[0].release()
        assert r.zcard(low.keys.holders) == 2  # one waiter took the freed permit
    finally:
        for proc in waiters:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
