"""Topologies: a lock through Sentinel, each grant acknowledged by the replicas.

Shown in docs/guides/topologies.md; run by tests/integration/test_docs_examples.py against a
private Sentinel group (``SENTINELS``: comma-separated ``host:port``; master ``mymaster``;
two replicas).
"""

from __future__ import annotations

import os

sentinels = [
    (host, int(port))
    for host, port in (a.rsplit(":", 1) for a in os.environ["SENTINELS"].split(","))
]

# --8<-- [start:sentinel]
from redis.sentinel import Sentinel

from celery_redislock import RedisLock

client = Sentinel(sentinels, socket_timeout=0.5).master_for("mymaster", socket_timeout=0.5)
# a grant counts only once both replicas acknowledged it (WAIT): a failover cannot
# grant the name twice; NotReplicated when they do not answer within replica_timeout
lock = RedisLock(client, "nightly-report", ttl=30, renew=True, min_replicas=2, replica_timeout=0.25)

with lock as lease:
    print("writing the report with fence", lease.fence)
# --8<-- [end:sentinel]

# the Celery tasks, the same through settings:
# --8<-- [start:celery]
from celery import Celery

app = Celery("proj")
app.conf.redislock_url = "sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379"
app.conf.redislock_transport_options = {"master_name": "mymaster"}
app.conf.redislock_min_replicas = 2  # as many as there are replicas
# --8<-- [end:celery]


def main() -> None:
    assert not lock.locked()


if __name__ == "__main__":
    main()
