"""Metrics: the collector registered in an app that already serves prometheus_client metrics.

Shown in docs/operations/metrics.md; run by tests/integration/test_docs_examples.py
(needs the ``metrics`` extra).
"""

from __future__ import annotations

import os

import redis

redis_client = redis.Redis.from_url(os.environ["REDIS_URL"])

# --8<-- [start:collector]
from prometheus_client import REGISTRY

from celery_redislock.celery.metrics.collector import RedisLockCollector

collector = RedisLockCollector(redis_client, "redislock")
REGISTRY.register(collector)
# --8<-- [end:collector]


def main() -> None:
    from prometheus_client import generate_latest

    try:
        text = generate_latest(REGISTRY).decode()
        assert "celery_redislock_up 1.0" in text, text[-2000:]
    finally:
        REGISTRY.unregister(collector)


if __name__ == "__main__":
    main()
