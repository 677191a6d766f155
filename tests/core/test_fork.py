"""A forked child closes the subscriber socket it inherits (issue 13, item 2).

Kept open, the child's copy keeps the connection alive after the waiting parent is
SIGKILLed: PUBSUB NUMSUB still counts the dead waiter as listening, so a release
grants it the lock, which then sits unused for a whole TTL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import redis

from celery_redislock import RedisLock

_WAITER = """
import os, sys, threading, time, redis
from celery_redislock import RedisLock
lock = RedisLock(redis.Redis.from_url(sys.argv[1]), "job", ttl=30)
threading.Thread(target=lambda: lock.acquire(timeout=60), daemon=True).start()
time.sleep(1.0)  # queued and subscribed
child = os.fork()
if child == 0:
    time.sleep(60)  # a forked child that outlives its parent (never touches Redis)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_killed_waiters_forked_child_does_not_keep_it_listening(
    r: redis.Redis, redis_url: str
) -> None:
    lock = RedisLock(r, "job", ttl=30)
    holder = lock.acquire()
    assert holder is not None
    waiter = subprocess.Popen([sys.executable, "-c", _WAITER, redis_url], stdout=subprocess.PIPE)
    child = 0
    try:
        assert waiter.stdout is not None
        child = int(waiter.stdout.readline())
        assert lock.info().waiters == 1
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait(10)
        time.sleep(0.3)  # the kernel closes the dead parent's descriptors
        assert holder.release()
        # Before: the child's copy of the subscriber socket kept the dead waiter
        # "listening" and the release granted it the lock for 30 s.
        assert not lock.locked()
        # The dead waiter keeps its place only until its 5 s heartbeat lapses.
        started = time.monotonic()
        again = lock.acquire(timeout=10)
        assert again is not None and again.release()
        assert time.monotonic() - started < 6.5
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)
        if waiter.stdout is not None:
            waiter.stdout.close()


def test_the_parents_subscriber_works_on_after_a_fork(r: redis.Redis) -> None:
    lock = RedisLock(r, "job", ttl=30)
    holder = lock.acquire()
    assert holder is not None
    assert lock.acquire(timeout=0.2) is None  # this process subscribed
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    got: list[object] = []
    import threading

    thread = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5)))
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert holder.release()
    thread.join(5)
    assert got and got[0] is not None
    assert time.monotonic() - started < 0.5  # woken by the release's message
    got[0].release()  # type: ignore[attr-defined]
