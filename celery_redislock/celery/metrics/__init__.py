"""Metrics: events counted in the lock Redis, the Prometheus exporter and the live page.

Holds the counter layout (:mod:`.schema`), the per-process recorder that adds events
to Redis (:mod:`.recorder`), the signal receivers that feed it (:mod:`.hooks`), the
read side shared by the exporter, the page and ``celery redislock top``
(:mod:`.read`), the ``prometheus_client`` collector (:mod:`.collector`) and the HTTP
server with the live page (:mod:`.server`). Imports the core and the shared glue
modules; ``prometheus_client`` (the ``metrics`` extra) only in the collector and the
server.
"""

from __future__ import annotations

from .hooks import connect
from .recorder import flush, record
from .schema import BUCKETS, KINDS, OUTCOMES

__all__ = ["BUCKETS", "KINDS", "OUTCOMES", "connect", "flush", "record"]
