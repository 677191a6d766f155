"""Runs handed a permit at intake that their worker, shutting down, will never start.

Intake's hand-over (:mod:`.intake`) reserves a free permit for a fresh run and
acknowledges its message: from then on the parked entry is the run's only copy. A
worker told to shut down sends nothing more to its pool processes -- a job not written
to one yet is dropped, and so is a request still waiting for a token of Celery's own
``rate_limit`` -- trusting the broker to deliver those messages again. A handed-over
run's message was acknowledged, so nothing came back: its permit stayed reserved for
``lock_ttl`` until the sweeper published the entry again, and the pool idled.

A lost broker connection drops the requests waiting in rate-limit buckets the same
way (Celery's consumer clears them: their messages come back from the broker).

So the main process remembers each hand-over until a pool process accepts the run
(:func:`handed_over`, :func:`accepted`), and when the worker is told to shut down
(Celery's ``worker_shutting_down``), or a bucket drops its requests
(:func:`give_back_dropped`, from :mod:`.buckets`), it gives the entries not accepted
back at once:
each goes back to its place in the queue, its reserved permit to the next claim,
which publishes it for another worker. A run accepted meanwhile after all is still
run once: its park token is taken once, whichever message gets there first (the other
is a second message of it, see :mod:`.redelivery`).

May import the core and the shared glue.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from itertools import repeat
from typing import TYPE_CHECKING, Final

from celery.signals import worker_shutting_down

from ...core.parking import ParkingQueue

if TYPE_CHECKING:
    from celery.worker.request import Request

__all__ = ["accepted", "connect", "give_back_all", "handed_over"]

logger = logging.getLogger("celery_redislock.celery.bounded.parking")

KEPT: Final = 4096
"""Hand-overs remembered at most (the oldest forgotten first: a run revoked before it
started is never accepted)."""

_pending: OrderedDict[int, tuple[Request, ParkingQueue, str]] = OrderedDict()
_guard = threading.Lock()


def handed_over(request: Request, queue: ParkingQueue, entry_id: str) -> None:
    """``request`` (in the main process) was handed the capacity reserved for its
    entry ``entry_id`` of ``queue``; its message is acknowledged."""
    with _guard:
        _pending[id(request)] = (request, queue, entry_id)
        while len(_pending) > KEPT:
            _pending.popitem(last=False)


def accepted(request: Request) -> None:
    """A pool process accepted ``request``: its run takes its entry itself."""
    if _pending:
        with _guard:
            _pending.pop(id(request), None)


def give_back_all() -> int:
    """Give back every hand-over not accepted (see the module); how many went back."""
    with _guard:
        pending = list(_pending.values())
        _pending.clear()
    return _give_back(pending)


def give_back_dropped(requests: list[Request]) -> None:
    """Celery dropped ``requests`` without running them (a task's rate-limit bucket
    cleared when the broker connection closed: their messages, it trusts, come back
    from the broker): give back those that were handed over, off the caller's thread
    (Celery's event loop)."""
    with _guard:
        pending = [p for p in map(_pending.pop, map(id, requests), repeat(None)) if p]
    if pending:
        threading.Thread(
            target=_give_back, args=(pending,), name="celery_redislock-handover", daemon=False
        ).start()


def _give_back(pending: list[tuple[Request, ParkingQueue, str]]) -> int:
    returned = 0
    for request, queue, entry_id in pending:
        try:
            if queue.give_back(entry_id):  # False: its run took it meanwhile
                returned += 1
                queue.pump()  # its permit to the next claim, published for another worker
                logger.info(
                    "celery_redislock: %s[%s] was handed a permit of pool %r but its worker "
                    "dropped it before it started: back in the parked queue",
                    getattr(request, "name", "?"),
                    getattr(request, "id", "?"),
                    queue.capacity.name,
                )
        except Exception as exc:
            logger.warning(
                "celery_redislock: %s[%s] handed a permit of pool %r could not be given "
                "back at shutdown (%s: %s); the sweeper publishes it when its "
                "reservation lapses",
                getattr(request, "name", "?"),
                getattr(request, "id", "?"),
                queue.capacity.name,
                type(exc).__name__,
                exc,
            )
    return returned


def _on_shutting_down(**_: object) -> None:
    # Sent from Celery's signal handler in the main process: the Redis calls run in a
    # thread of their own (not daemon: the worker's exit waits for it), never inside
    # the handler, which may have interrupted a command on a shared connection.
    if _pending:
        threading.Thread(
            target=give_back_all, name="celery_redislock-handover", daemon=False
        ).start()


def connect() -> None:
    """Give hand-overs back when the worker is told to shut down (idempotent)."""
    worker_shutting_down.connect(
        _on_shutting_down, weak=False, dispatch_uid="celery_redislock.handover.shutting_down"
    )
