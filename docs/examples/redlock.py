"""Redlock: one lock held by a majority of independent masters.

Shown in docs/guides/redlock.md; run by tests/integration/test_docs_examples.py with three
private redis-servers (``REDLOCK_URLS``, comma-separated).
"""

from __future__ import annotations

import os

# --8<-- [start:redlock]
import redis

from celery_redislock import RedlockLock

masters = [
    redis.Redis.from_url(url, socket_timeout=0.5) for url in os.environ["REDLOCK_URLS"].split(",")
]
lock = RedlockLock(masters, "nightly-report", ttl=30.0, renew=True)

with lock as lease:  # held by a majority of the masters
    print("writing the report with fence", lease.fence)
# --8<-- [end:redlock]


def main() -> None:
    lease = lock.acquire(blocking=False)
    assert lease is not None
    assert lock.acquire(blocking=False) is None  # held: a second acquire is refused
    assert lease.release()


if __name__ == "__main__":
    main()
