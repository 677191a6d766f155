"""Topologies: a lock on Redis Cluster (each lock lives on its slot's primary).

Shown in docs/guides/topologies.md; run by tests/integration/test_docs_examples.py against a
private 3 + 3 cluster (``CLUSTER_NODE``: ``host:port`` of any node).
"""

from __future__ import annotations

import os

node_host, node_port = os.environ["CLUSTER_NODE"].rsplit(":", 1)

# --8<-- [start:cluster]
from redis.cluster import RedisCluster

from celery_redislock import RedisLock

client = RedisCluster(host=node_host, port=int(node_port), socket_timeout=1)  # any node
lock = RedisLock(client, "nightly-report", ttl=30, renew=True)
# --8<-- [end:cluster]


def main() -> None:
    with lock as lease:
        assert lock.locked()
        assert lease.held()
    assert not lock.locked()
    client.close()


if __name__ == "__main__":
    main()
