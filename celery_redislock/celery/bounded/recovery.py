"""Recovery: park again, in a lock Redis that lost its data, every run the journal holds.

Each worker's sweeper (:mod:`.sweeper`) reads the lock Redis's mark
(``<prefix>:parking:epoch``, set once) at every sweep and calls :func:`recover` with
it; recovery is keyed by that mark *and* the server's ``run_id``, so it also runs after
a restart that kept only part of the data (an AOF or RDB missing the last writes) and
after a failover to a replica that lagged (the newest parks lost, the mark kept). The
first sweeper to see a key the journal (:mod:`.journal`) has not recovered for parks
every journaled run again, oldest first, under its own park token, in the queue it
was parked in (its :class:`~.journal.ParkSpec`: whatever kind of capacity that queue
waits for, :func:`~.parking.queue_for`) and with its own owner; then the journal
learns the key. Several sweepers doing it at
once, a sweeper dying half-way (the next one does it all again), or a run of a
journaled entry starting meanwhile cannot run a task twice: a park of a token the
lock Redis knows (parked, claimed or taken) changes nothing, and a run drops its
journal entry before it consumes its token. A run the lock Redis still knows (parked,
claimed or taken: a restart that kept the data, a run parked in the new lock Redis
before recovery) is left alone: parking it again would change nothing but answer the
runs its first park claimed, and publish a claimed run's message a second time (one
token: one runs, one is skipped); one that becomes known between that check and its
park is, harmlessly, as before the check.

May import the core and the shared glue, :mod:`.parking` and :mod:`.journal`.
"""

from __future__ import annotations

import logging
import weakref

from celery import Celery
from redis.cluster import RedisCluster

from ...core.scripts import RedisClient
from ..client import get_redis
from .journal import journal_for, read_value
from .parking import queue_for

__all__ = ["recover"]

logger = logging.getLogger(__name__)

_recovered: weakref.WeakKeyDictionary[Celery, str] = weakref.WeakKeyDictionary()  # app -> mark


def recover(app: Celery, mark: str) -> int | None:
    """Park the journaled runs again if the lock Redis marked ``mark`` lost its data:
    how many this call parked again (0: nothing to do, or done by another worker);
    None when the app keeps no journal."""
    journal = journal_for(app)
    if journal is None:
        return None
    mark = f"{mark}/{_run_id(get_redis(app))}"
    if _recovered.get(app) == mark or journal.knows(mark):
        _recovered[app] = mark
        return 0
    parked = 0
    for entry_id, value in journal.entries():
        try:
            spec, owner, payload = read_value(value)
            queue = queue_for(app, spec)
        except ValueError as exc:  # ConfigurationError too: a kind or terms not known
            logger.error(
                "celery_redislock: journaled parked run %s cannot be read (%s); "
                "dropped from the journal",
                entry_id,
                exc,
            )
            journal.drop(entry_id)
            continue
        if queue.known(entry_id):
            # Not lost (a restart that kept the data, or a run already parked again):
            # its park would change nothing but answer what its first park claimed,
            # and a claimed run's message would be published a second time.
            continue
        queue.park(entry_id, payload, owner)
        parked += 1
    journal.learn(mark)
    _recovered[app] = mark
    return parked


def _run_id(client: RedisClient) -> str:
    """The lock Redis server's ``run_id`` (new at every start and on every other
    server); "" on a cluster, whose nodes each have their own."""
    if isinstance(client, RedisCluster):
        return ""
    return str(client.info("server").get("run_id", ""))
