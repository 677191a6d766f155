"""The core rate limiter: N calls per period across every process, by Redis's clock.

Shown in docs/guides/rate-limits.md and the README; run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

# --8<-- [start:limiter]
import os
import time

import redis

from celery_redislock import RedisRateLimiter

client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
api = RedisRateLimiter(client, "partner-api", rate="5/s")  # or a list: every rate must admit


def call_partner(n: int) -> None:
    if not api.acquire(timeout=30):  # sleeps until Redis admits the call
        raise TimeoutError("partner-api: no admission within 30 s")
    ...  # at most 5 calls in any 1 s window, across every process


# --8<-- [end:limiter]


def main() -> None:
    api.reset()
    start = time.monotonic()
    for n in range(10):
        call_partner(n)
    assert time.monotonic() - start >= 0.9  # the second five waited for the window
    api.reset()


if __name__ == "__main__":
    main()
