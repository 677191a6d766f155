"""A worker process of the no-overlap test: takes the Redlock in a loop, records each
critical section.

``python -m tests.topologies.redlock._workers PORTS NAME SECONDS OUT`` writes one line
per section to OUT: ``start end fence valid`` (``time.monotonic()``, the same clock in
every process on Linux; ``valid`` is 1 when the lease was still valid at ``end``).
"""

from __future__ import annotations

import sys
import time

import redis

from celery_redislock import RedlockLock, RedlockUnavailable

HOLD = 0.002


def main() -> None:
    ports = [int(port) for port in sys.argv[1].split(",")]
    name, seconds, out = sys.argv[2], float(sys.argv[3]), sys.argv[4]
    clients = [
        redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) for port in ports
    ]
    lock = RedlockLock(clients, name, ttl=1.0, master_timeout=0.2)
    stop = time.monotonic() + seconds
    with open(out, "w") as log:
        while time.monotonic() < stop:
            try:
                lease = lock.acquire(timeout=2)
            except RedlockUnavailable:
                continue  # masters restarting: fewer than a majority answered
            if lease is None:
                continue
            start = time.monotonic()
            time.sleep(HOLD)
            end = time.monotonic()
            valid = int(lease.remaining() > 0 and not lease.lost)
            lease.release()
            log.write(f"{start!r} {end!r} {lease.fence} {valid}\n")


if __name__ == "__main__":
    main()
