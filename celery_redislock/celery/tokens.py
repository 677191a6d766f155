"""Message headers, execution tokens and owner ids of singleton locks.

**Headers.** ``apply_async`` puts the queued lease's token (``redislock_token``) and the
lock name (``redislock_key``) in the message. A message that arrives without a token
(``send_task``, beat falling back to ``send_task``, a foreign producer) is stamped with
a random ``redislock_nonce`` by the worker's main process when it receives it (see
:mod:`.cleanup`); the request dict it stamps is the one handed to the pool.

**Execution token.** A run's lease token is derived from the token or nonce of its
message (:func:`run_token`), so the worker's main process, which never sees the child's
leases, can still release exactly that lease after a revoke, a hard time limit or a lost
child. ``RedisLock.adopt`` refuses a derived token that is already live, so a broker
redelivery of a running message can never share its lease.

**Owner ids.** The lock's owner id tells who holds it: ``"<task id>#<nonce>"`` while the
task is queued, ``"<task id>@<nonce>"`` once a run adopted it. The nonce is random per
lease, so no two acquisitions ever pass the same owner id and the core's counted
re-entry by owner never lets a second copy in (two ``apply_async(task_id=X)`` calls,
or a redelivered copy of a running task). The part before the marker is the task id
(``on_duplicate="existing"`` returns it); the marker tells queued from running
(``"replace"`` only takes over a queued copy).
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Final

__all__ = [
    "PARK_HEADER",
    "HEADERS",
    "KEY_HEADER",
    "NONCE_HEADER",
    "RECHECK_HEADER",
    "RESENT_HEADER",
    "TOKEN_HEADER",
    "park_token",
    "parse_owner",
    "queued_owner",
    "run_token",
    "running_owner",
]

TOKEN_HEADER: Final = "redislock_token"
"""Header: token of the queued lease handed to the worker."""

KEY_HEADER: Final = "redislock_key"
"""Header: the singleton lock's name, so the worker need not recompute it."""

NONCE_HEADER: Final = "redislock_nonce"
"""Header: a random seed for the execution token of a message sent without a token."""

RECHECK_HEADER: Final = "redislock_recheck"
"""Header: a redelivered copy re-sent once to see whether its first run is alive."""

RESENT_HEADER: Final = "redislock_resent"
"""Header: a copy this package re-sent (not a retry); its "received" line is not logged
again (see :mod:`.logs`)."""

PARK_HEADER: Final = "redislock_park"
"""A parked run's message: ``"<park token> <retries> <first refusal>"`` (made and read
by ``bounded/parking.py``; the singleton guard only asks whether it is there)."""

HEADERS: Final = (TOKEN_HEADER, KEY_HEADER, NONCE_HEADER, RECHECK_HEADER, RESENT_HEADER)
"""Every header this package sets; ``retry()`` copies them, so they are overwritten."""

_QUEUED: Final = "#"
_RUNNING: Final = "@"


def park_token(task_id: str, retries: int, identity: bytes) -> str:
    """The park token of a fresh message's run: derived, not random, so every delivery
    of one message (a broker's redelivery) parks under one token, which Redis knows the
    second time. ``identity`` tells two publishes of one task id and ``retries`` apart
    (the ``redislock_sent`` stamp, or a digest of the body)."""
    seed = b"%s\0%d\0%s" % (task_id.encode(), retries, identity)
    return hashlib.sha256(b"redislock intake\0" + seed).hexdigest()[:32]


def run_token(seed: str) -> str:
    """The execution token of a run whose message carries ``seed`` (token or nonce)."""
    return hashlib.sha256(f"{seed}:run".encode()).hexdigest()[:32]


# The nonce only has to differ between leases, not to be secret (the lease token is
# the secret), so a private generator seeded from os.urandom does, without a system
# call per task. Private, so user code calling random.seed() cannot make two
# processes draw the same nonces; re-seeded in a forked child for the same reason.
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)


def _nonce() -> str:
    return f"{_random.getrandbits(48):012x}"


def queued_owner(task_id: str) -> str:
    """A fresh owner id for the queued lease of ``task_id``."""
    return f"{task_id}{_QUEUED}{_nonce()}"


def running_owner(task_id: str) -> str:
    """A fresh owner id for the running lease of ``task_id``."""
    return f"{task_id}{_RUNNING}{_nonce()}"


def parse_owner(owner: str | None) -> tuple[str | None, bool | None]:
    """``(task id, running?)`` of an owner id; ``running`` is None when unknown.

    An owner id not set by this module (a lock taken with the core API) is returned
    whole as the task id, with ``running=None``.
    """
    if not owner:
        return None, None
    at, hash_ = owner.rfind(_RUNNING), owner.rfind(_QUEUED)
    cut = max(at, hash_)
    if cut <= 0 or not _is_nonce(owner[cut + 1 :]):
        return owner, None
    return owner[:cut], cut == at


def _is_nonce(text: str) -> bool:
    return len(text) == 12 and all(c in "0123456789abcdef" for c in text)
