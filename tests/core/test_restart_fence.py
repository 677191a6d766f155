"""Restart grace (core/restart.py) on a server whose wall clock went back.

The restarted server's clock is put behind by an LD_PRELOAD shim (built with the C
compiler; skipped without one) that shifts gettimeofday/clock_gettime but not
time(), which Redis took its start time from: the server is as one whose clock was
stepped back after it started (an NTP step, a VM restored), and INFO's uptime, wall
clock time since the start, is negative.

* The scripts that read the uptime (the grace's start, a Redlock master's boot
  check) must not fail on it.
* A semaphore's fences are the server's µs clock at the grant, and the restart lost
  the last one: a grant after it must still be fenced above the leases granted
  before it (a holder that renews within the grace tells the server its fence).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
import redis

from celery_redislock import RedisSemaphore
from celery_redislock.core.lock_scripts import ACQUIRE
from celery_redislock.testing import RedisServer

TTL = 1.5
BEHIND = 60  # seconds the restarted server's clock is behind

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
static long shift(void) { const char *s = getenv("REDISLOCK_CLOCK_SHIFT"); return s ? atol(s) : 0; }
int gettimeofday(struct timeval *tv, void *tz) {
  static int (*real)(struct timeval *, void *);
  if (!real) real = dlsym(RTLD_NEXT, "gettimeofday");
  int r = real(tv, tz); if (tv) tv->tv_sec += shift(); return r;
}
int clock_gettime(clockid_t id, struct timespec *ts) {
  static int (*real)(clockid_t, struct timespec *);
  if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
  int r = real(id, ts);
  if (ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += shift();
  return r;
}
"""


@pytest.fixture
def clock_shim() -> Iterator[str]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the clock shim")
    with tempfile.TemporaryDirectory() as where:
        source, shim = os.path.join(where, "shift.c"), os.path.join(where, "shift.so")
        with open(source, "w") as out:
            out.write(_SHIM)
        subprocess.run([compiler, "-shared", "-fPIC", "-o", shim, source, "-ldl"], check=True)
        yield shim


@pytest.fixture
def behind(clock_shim: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """A server started with its wall clock BEHIND seconds back (see the module)."""
    monkeypatch.setenv("LD_PRELOAD", clock_shim)
    monkeypatch.setenv("REDISLOCK_CLOCK_SHIFT", str(-BEHIND))
    with RedisServer() as server:
        monkeypatch.delenv("LD_PRELOAD")
        yield server


def test_a_negative_uptime_fails_no_script(behind: RedisServer) -> None:
    client = redis.Redis(port=behind.port, socket_timeout=1, socket_connect_timeout=0.5)
    assert int(client.info("server")["uptime_in_seconds"]) < 0  # the shim works
    sem = RedisSemaphore(client, "pool", limit=1, ttl=TTL, restart_grace=True)
    lease = sem.acquire(blocking=False)  # the client's first call sets the marker
    assert lease is not None
    client.flushall()  # the data lost: the next call starts a grace, reading the uptime
    assert sem.acquire(blocking=False) is None, "a newcomer let in within the grace"
    holders = "redislock:lock:{job}:holders"
    keys = [
        holders,
        "redislock:lock:{job}:fence",
        "redislock:lock:{job}:queue",
        "redislock:lock:{job}:alive",
        "redislock:lock:{job}:asks",
        "boot:x",
    ]
    reply = ACQUIRE(client, keys, ["t" * 16, 1000, "", "0", 0, 5000])
    assert reply[0] == 0 and reply[3] == b"restarted", reply  # a Redlock master refuses


def test_a_grant_after_a_restart_behind_in_time_is_fenced_above_the_live_lease(
    clock_shim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer() as server:
        client = redis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=0.5)
        sem = RedisSemaphore(client, "pool", limit=1, ttl=TTL, restart_grace=True)
        old = sem.acquire(blocking=False, renew=True)
        assert old is not None
        monkeypatch.setenv("LD_PRELOAD", clock_shim)  # the next redis-server only
        monkeypatch.setenv("REDISLOCK_CLOCK_SHIFT", str(-BEHIND))
        server.restart()
        monkeypatch.delenv("LD_PRELOAD")
        assert float(client.time()[0]) < old.fence / 1e6 - BEHIND / 2  # the shim works
        newcomer = RedisSemaphore(client, "pool", limit=1, ttl=TTL, restart_grace=True)
        new = newcomer.acquire(timeout=4 * TTL)  # after the grace, or a hand-off
        assert new is not None
        assert new.fence > old.fence, "a later grant fenced below a lease granted before"
        new.release()
        old.release()
