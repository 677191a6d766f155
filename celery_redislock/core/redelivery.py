"""Another message of a parked run that started already: is its first run alive?

A parked run's message is published again when its reservation lapsed, and a broker
hands a message out again when the worker that had it died unacknowledged. The copy
finds its park token consumed (:meth:`~.parking.ParkingSemaphore.take` answers
``"duplicate"``). Whether it must run is for Redis to say, from the first run's permit
(#24): a run that ended marked its entry (:func:`mark_ran`); a live one renews its
permit, whose token is the entry's id (or another token it named with
:func:`mark_token`); a permit that lapsed unrenewed belonged to a dead run, whose copy
now runs, on a permit under the entry's id again (``redelivered_take.lua``).

Keys, beside the parking ones: ``run:<id>`` (a string kept as long as a consumed id).
"""

from __future__ import annotations

import time
from typing import Final

from .lease import Lease, OnLost
from .lock import SCRIPT_CONSTANTS
from .parking import ParkingSemaphore
from .restart import grace_args
from .scripts import LuaScript, reply_array, reply_int

__all__ = [
    "ALIVE",
    "DEAD_REFUSED",
    "ENDED",
    "NOT_TAKEN",
    "RETAKEN",
    "mark_ran",
    "mark_token",
    "retake",
]

_RETAKE = LuaScript("redelivered_take.lua", SCRIPT_CONSTANTS)

NOT_TAKEN: Final = "not-taken"
"""The id was never consumed: take it as usual."""
ENDED: Final = "ended"
"""The first run ended (or was parked again under another id): do not run."""
ALIVE: Final = "alive"
"""The first run's permit is live (alive, or dead for less than a lease)."""
DEAD_REFUSED: Final = "dead-refused"
"""The first run is dead; no permit is free: park this message again, under a new id."""
RETAKEN: Final = "retaken"
"""The first run is dead: this message is the run, with the lease returned."""


def run_key(sem: ParkingSemaphore, entry_id: str) -> str:
    """The key recording how the run of consumed ``entry_id`` holds (or held) its permit."""
    return sem.keys.key(f"run:{entry_id}")


def retake(
    sem: ParkingSemaphore,
    entry_id: str,
    owner: str,
    *,
    ttl: float,
    memory: float,
    renew: bool = True,
    on_lost: OnLost | None = None,
) -> tuple[str, Lease | None, float]:
    """Look at the first run of consumed ``entry_id`` (one round trip): ``(status,
    lease, seconds)`` -- ``seconds`` the first run's permit has left when
    :data:`ALIVE`; ``lease`` this message's permit when :data:`RETAKEN` (see the
    module). ``memory``: seconds a written mark is kept (the consumed id's memory)."""
    ttl_ms, _ = sem._lease_terms(ttl, None, owner)
    k = sem.keys
    sent_at = time.monotonic()
    reply = _RETAKE(
        sem.client,
        [
            k.holders,
            k.leases,
            k.fence,
            k.meta,
            k.queue,
            sem.parked_key,
            sem.payloads_key,
            sem.claimed_key,
            sem.taken_key,
            run_key(sem, entry_id),
        ],
        [entry_id, ttl_ms, owner, sem.limit, max(1, int(memory * 1000)), *grace_args(sem)],
    )
    reply = reply_array(reply)
    status = reply_int(reply[0])
    if status == -2:
        return NOT_TAKEN, None, 0.0
    if status == -1:
        return ENDED, None, 0.0
    if status == -3:
        return DEAD_REFUSED, None, 0.0
    if status == 0:
        return ALIVE, None, reply_int(reply[1]) / 1000.0
    lease = sem._new_lease(
        entry_id, reply_int(reply[1]), reply_int(reply[2]), owner, sent_at, renew, on_lost, None
    )
    return RETAKEN, lease, 0.0


def mark_ran(sem: ParkingSemaphore, entry_id: str, memory: float) -> None:
    """The run of consumed ``entry_id`` ended: a further message of it never runs.
    Written before its permit is given back (a run killed between the two leaves a
    mark and a permit that lapses: a copy is skipped, as the body did end)."""
    sem.client.set(run_key(sem, entry_id), "ran", px=max(1, int(memory * 1000)))


def mark_token(sem: ParkingSemaphore, entry_id: str, token: str, memory: float) -> None:
    """The run of consumed ``entry_id`` holds the permit of ``token`` (not the id's):
    its liveness is that lease's. Never over a mark already there: written off the
    run's path, it may come after a short run ended and marked its entry as run."""
    key = run_key(sem, entry_id)
    sem.client.set(key, f"l {token}", px=max(1, int(memory * 1000)), nx=True)
