"""Celery's own ``rate_limit`` beside a bounded pool: intake parking before the bucket.

Celery throttles a task with a ``rate_limit`` in the worker's main process: each
message waits in the task's token bucket (a kombu ``TokenBucket`` in
``consumer.task_buckets``) until a token is free, and only then is it sent to a pool
process -- where intake parking looks at it (:mod:`.intake`, from ``revoked()``). A
backlog of a bounded task with ``rate_limit="10/s"`` therefore left the broker at
10 per second per worker, *each message costing a token* whether it ran or was
parked; the runs a release published went to the tail of that backlog, their
reserved permits lapsed before they were read, the sweeper published them again, and
the pool idled for ~90 s (#29 item 1).

Here the bucket of such a task is replaced, in each worker's main process, by an
:class:`IntakeBucket`: a message entering it is looked at for parking first (once, as
``revoked()`` would later), and a parked one never enters it -- acknowledged at once,
no token spent. The backlog is parked as fast as the worker reads it, a released run
finds no backlog before it, and the tokens are spent by the runs that run: the
throughput ``rate_limit`` asks for. Celery's remote ``rate_limit`` command and
anything else that makes new buckets are followed (the next message of the task
replaces the new bucket too).

May import the bounded feature's modules and the shared glue.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from celery.signals import task_received
from kombu.utils.limits import TokenBucket

from .handover import give_back_dropped
from .intake import BoundedRequest

__all__ = ["IntakeBucket", "connect"]


class IntakeBucket(TokenBucket):
    """A task's token bucket that parks a bounded run at intake before it waits for a
    token (see the module)."""

    _dropped = False
    contents: deque[Any]  # kombu's (public, set in __init__; not in its type stubs)

    def add(self, item: Any) -> None:
        """Queue ``(request, tokens)``; a request parked at intake (or revoked) instead
        ends here, as Celery ends a revoked one."""
        request = item[0] if isinstance(item, tuple) and item else None
        if isinstance(request, BoundedRequest) and request.revoked():
            # Celery looks at the bucket right after adding (``_limit_task``): with a
            # request waiting and no token, each look schedules one more timer entry.
            # One per parked message piled up, and with more than 10 due at once the
            # worker's event loop polls for a whole second (kombu's ``fire_timers``):
            # ~1 s per run. The requests waiting have their timer already.
            self._dropped = True
            return
        super().add(item)

    def clear_pending(self) -> None:
        """Drop the requests waiting for a token (Celery's consumer does when its
        broker connection closes: their messages come back from the broker); those
        handed a permit at intake, whose messages were acknowledged, are given back
        (:mod:`.handover`)."""
        dropped = [item[0] for item in self.contents if isinstance(item, tuple) and item]
        super().clear_pending()
        give_back_dropped(dropped)

    def pop(self) -> Any:
        """The next ``(request, tokens)``; right after a dropped ``add``, none (see
        :meth:`add`)."""
        if self._dropped:
            self._dropped = False
            raise IndexError("nothing added")
        return super().pop()


def _on_received(sender: object = None, request: object = None, **_: object) -> None:
    """Before Celery looks up the task's bucket (``task_received`` is sent right
    before): make a bounded task's plain bucket an :class:`IntakeBucket`."""
    if not isinstance(request, BoundedRequest):
        return
    buckets = getattr(sender, "task_buckets", None)
    name = getattr(request, "name", None)
    if buckets is None or name is None:
        return
    bucket = buckets.get(name)
    if (
        isinstance(bucket, IntakeBucket)
        or not isinstance(bucket, TokenBucket)
        or bucket.fill_rate is None
    ):
        return
    # The old bucket's requests stay in it: Celery's timer drains it (it holds that
    # object), so moving them would send them twice.
    buckets[name] = IntakeBucket(bucket.fill_rate, bucket.capacity)


def connect() -> None:
    """Replace the buckets of bounded tasks as their messages arrive (idempotent)."""
    task_received.connect(
        _on_received, weak=False, dispatch_uid="celery_redislock.buckets.task_received"
    )
