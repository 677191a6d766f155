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

from typing import Any

from ...core import Lease
from ...core.lease import OnLost
from ...core.parking import DUPLICATE, TAKEN, ParkingSemaphore
from .journal import forget

__all__ = ["take_parked"]


def take_parked(app: Any, sem: ParkingSemaphore, entry_id: str, owner: str, *, standby: int,
                wait: float, ttl: float, on_lost: OnLost) -> tuple[str, Lease | None]:  # fmt: skip
    """Start the run of parked entry ``entry_id``: ``(status, lease)`` as
    :meth:`~celery_redislock.core.parking.ParkingSemaphore.take` answers, after waiting
    in place up to ``wait`` seconds first when the entry is a standby and fewer than
    ``standby`` runs of the pool wait in place (see the module)."""
    early = None
    if standby and _is_standby(sem, entry_id, standby):
        early = sem.acquire(timeout=wait, owner=owner, ttl=ttl, renew=True, on_lost=on_lost)
    forget(app, entry_id)  # before the token is consumed: see journal.py
    status, lease = sem.take(entry_id, owner, ttl=ttl, renew=True, on_lost=on_lost)
    if early is None:
        return status, lease
    if status == DUPLICATE:  # another message of the entry ran: not this one
        early.release()
        return status, None
    if lease is not None:  # reserved for it meanwhile (published again): one is enough
        lease.release()  # (its release tops the standbys up)
    else:  # refused a second permit, but the token is consumed: the run is this one
        sem.client.hdel(sem.payloads_key, f"r:{entry_id}")  # take's note, not needed
        # The release that handed it the permit still counted it as a standby on its
        # way (its entry was claimed): the next one is published ahead now.
        sem.pump()
    return TAKEN, early


def _is_standby(sem: ParkingSemaphore, entry_id: str, standby: int) -> bool:
    """True when no permit is reserved for ``entry_id`` (claimed ahead as a standby)
    and fewer than ``standby`` runs of the pool wait in place (one round trip)."""
    pipe = sem.client.pipeline(transaction=False)
    pipe.zscore(sem.keys.holders, entry_id)
    pipe.zcard(sem.keys.queue)
    reserved, waiting = pipe.execute()
    return reserved is None and int(waiting) < standby
