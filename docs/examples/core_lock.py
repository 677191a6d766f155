"""The core without Celery: a lock and a semaphore over redis-py.

Shown in docs/guides/core.md; run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

# --8<-- [start:core]
import os

import redis

from celery_redislock import RedisLock, RedisSemaphore

client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
lock = RedisLock(client, "nightly-report", ttl=30.0)

with lock as lease:  # blocks until granted; released on exit
    print("writing the report with fence", lease.fence)

lease = lock.acquire(blocking=False)  # None when held elsewhere
if lease is not None:
    try:
        ...
    finally:
        lease.release()  # False if the lease had been lost meanwhile

api = RedisSemaphore(client, "payment-api", limit=5, ttl=30.0, renew=True)
with api as permit:  # at most 5 holders at any instant
    print("calling the API as", permit.token[:8])

with lock.hold(timeout=5, owner="job-7", ttl=10, renew=True) as lease:  # LockTimeout
    lease.held()  # one read-only round trip: still ours on Redis?
    lease.extend(10, add=True)  # adds 10 s to the time left (redis-py's extend)
# --8<-- [end:core]


def main() -> None:
    assert not lock.locked()
    assert api.available() == 5


if __name__ == "__main__":
    main()
