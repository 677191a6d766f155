"""A process that takes a Redlock lease with renewal and reports on stdout.

``python -m tests.topologies.redlock._holder PORT,PORT,... NAME TTL`` prints
``held <fence>``, then ``lost <reason>`` when the lease is found lost, and exits
after ``lost`` or 30 s. The test pauses it (SIGSTOP) to stand for a client paused
past its validity (a GC pause, a stopped VM).
"""

from __future__ import annotations

import sys
import threading

import redis

from celery_redislock import RedlockLock


def main() -> None:
    ports = [int(port) for port in sys.argv[1].split(",")]
    name, ttl = sys.argv[2], float(sys.argv[3])
    clients = [redis.Redis(port=port, socket_timeout=0.5) for port in ports]
    lost = threading.Event()
    lock = RedlockLock(clients, name, ttl=ttl, renew=True)
    lease = lock.acquire(timeout=10, on_lost=lambda lease: lost.set())
    assert lease is not None
    print(f"held {lease.fence}", flush=True)
    lost.wait(30)
    print(f"lost {lease.lost_reason}", flush=True)
    print(f"release {lease.release()}", flush=True)


if __name__ == "__main__":
    main()
