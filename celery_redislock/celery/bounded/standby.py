"""The start of a parked run: its park token taken, after a standby's wait in place.

A parked run published by a release has a permit reserved for it: its run takes the
token and that permit at once (:meth:`~celery_redislock.core.parking.ParkingSemaphore.take`).
A **standby** (``concurrency_standby``: claimed ahead, no permit reserved) first waits
in place for the next release, which hands it a permit with no broker round trip --
and only then takes its token. The order matters when its worker dies: until the token
is taken, the entry stays claimed, with its payload (and its journal record), so a
standby whose pool process dies with its main while it waits goes back to the queue
when its claim lapses and is published again. Taken first, the entry would be gone
with the process. A second message of the entry meanwhile (the claim lapsed and the
entry was published again) is harmless: whichever run takes the token first runs, the
other is told it is a duplicate and gives its permit back.

May import the core and the bounded feature's journal.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery

from ...core import Lease
from ...core.lease import OnLost
from ...core.parking import DUPLICATE, TAKEN, ParkingSemaphore
from ...core.redelivery import mark_token
from .journal import forget

__all__ = ["take_parked"]

logger = logging.getLogger(__name__)


def take_parked(
    app: Celery,
    sem: ParkingSemaphore,
    entry_id: str,
    owner: str,
    *,
    standby: int,
    wait: float,
    ttl: float,
    on_lost: OnLost,
    memory: float = 3600.0,
) -> tuple[str, Lease | None]:
    """Start the run of parked entry ``entry_id``: ``(status, lease)`` as
    :meth:`~celery_redislock.core.parking.ParkingSemaphore.take` answers, after waiting
    in place up to ``wait`` seconds first when the entry is a standby and fewer than
    ``standby`` runs of the pool wait in place (see the module); ``memory``: seconds
    the entry remembers the run's permit (its consumed token's memory)."""
    early = None
    if standby and _is_standby(sem, entry_id, standby):
        early = sem.acquire(timeout=wait, owner=owner, ttl=ttl, renew=True, on_lost=on_lost)
    forget(app, entry_id)  # before the token is consumed: see journal.py
    try:
        status, lease = sem.take(entry_id, owner, ttl=ttl, renew=True, on_lost=on_lost)
    except BaseException:
        if early is not None:  # no hold owns it yet: renewed for the process's life else
            _give_back(early)
        raise
    if early is None:
        return status, lease
    if status == DUPLICATE:  # another message of the entry ran: not this one
        early.release()
        return status, None
    if lease is not None:  # reserved for it meanwhile (published again): one is enough,
        # the one under the entry's id, by which another message of it sees the run
        # alive (#24); given back the other way, that message could find the freed
        # permit before the run named its own, and run beside it.
        early.release()  # (its release tops the standbys up)
        return TAKEN, lease
    # Refused a second permit, the token is consumed: the run is this one, on the
    # permit it waited for. Off the run's path (it starts at once: the hand-off is what
    # standbys save): name that permit for its entry, so another message of it sees
    # the run alive (#24; until then the refusal's note drops it), and top the
    # standbys up.
    threading.Thread(
        target=_after_early,
        args=(sem, entry_id, early.token, memory),
        daemon=True,
        name="celery_redislock-standby",
    ).start()
    return TAKEN, early


def _give_back(lease: Lease) -> None:
    """Release ``lease`` (renewal stopped first, so it expires if the release fails
    too), never raising: the caller re-raises what made it give the lease back."""
    try:
        lease.release()
    except Exception as exc:
        logger.debug(
            "celery_redislock: a standby's permit not given back, it expires (%s: %s)",
            type(exc).__name__,
            exc,
        )


def _after_early(sem: ParkingSemaphore, entry_id: str, token: str, memory: float) -> None:
    """Name the permit the standby's run holds (token ``token``) as its entry's (see
    :func:`~celery_redislock.core.redelivery.mark_token`); then drop take's note of
    the refusal (not needed: the run has its permit; a message of the entry reads
    the name from here on) and publish the next standby: the release that handed this
    one the permit still counted it as on its way (its entry was claimed). On failure
    the next release tops up; the note stays (another message is dropped)."""
    try:
        mark_token(sem, entry_id, token, memory)
        sem.client.hdel(sem.payloads_key, f"r:{entry_id}")
        sem.pump()
    except Exception as exc:
        logger.debug(
            "celery_redislock: standbys of pool %r not topped up (%s: %s)",
            sem.name,
            type(exc).__name__,
            exc,
        )


def _is_standby(sem: ParkingSemaphore, entry_id: str, standby: int) -> bool:
    """True when no permit is reserved for ``entry_id`` (claimed ahead as a standby)
    and fewer than ``standby`` runs of the pool wait in place (one round trip)."""
    pipe = sem.client.pipeline(transaction=False)
    pipe.zscore(sem.keys.holders, entry_id)
    pipe.zcard(sem.keys.queue)
    reserved, waiting = pipe.execute()
    return reserved is None and int(waiting) < standby
