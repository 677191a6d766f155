"""The core rate limiter's whole API: several rates, costs, corrections, a 429's penalty.

Shown in docs/guides/rate-limits.md; run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

import os

import redis

client = redis.Redis.from_url(os.environ["REDIS_URL"])
estimate, used = 800, 650  # tokens a call is expected to use, and then did

# --8<-- [start:api]
from celery_redislock import RateLimited, RedisRateLimiter

api = RedisRateLimiter(client, "openai", rate=["500/m", "90000/m"])  # all must admit
tokens = RedisRateLimiter(client, "openai-tokens", rate="90000/m")

if api.acquire(timeout=30):  # sleeps until the server's admission time
    ...
tokens.acquire(cost=estimate)  # blocking; a cost of `estimate` units
tokens.adjust(used - estimate)  # correct this thread's (task's) last admission
api.retry_after()  # seconds until a call is admitted; charges nothing
api.penalize(12)  # a 429 with Retry-After: 12 -- nobody, anywhere, for 12 s
api.override("100/m", ttl=600)  # a temporary rate, kept in Redis; clear_override()
api.info()  # rates, what each counts, next admission, override
api.reset()
# --8<-- [end:api]


def main() -> None:
    assert api.retry_after() == 0  # reset: admitted at once
    assert RedisRateLimiter.attach(client, "openai-tokens") is not None
    tokens.reset()
    assert issubclass(RateLimited, Exception)


if __name__ == "__main__":
    main()
