"""The renewer's bookkeeping: one :class:`Entry` per lease, heap items, loss reports.

Each entry has exactly one *current* item in the scheduler's heap, ``(due, ticket,
early, entry)``: a renewal (due TTL/3 after the last send, may join a tick from
TTL/6 on), a retry after an error, or the loss check at the lease's deadline.
Pushing a new item supersedes the previous one, which is skipped when popped.
"""

from __future__ import annotations

import heapq
import logging
import weakref
from collections.abc import Callable
from typing import Protocol, TypeAlias

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..clients import AnyRedisClient
from ..lease_state import LeaseState
from ..scripts import LuaScript

__all__ = [
    "Entry",
    "MasterGroup",
    "RenewalClient",
    "HeapItem",
    "Renewable",
    "Reply",
    "current",
    "loss_reason",
    "pop_superseded",
    "report",
    "restart_grace_ms",
]

log = logging.getLogger(__name__)

NOT_HELD = "renewal found the lease no longer held: expired, released elsewhere or taken over"
"""Loss reason when Redis answers that the lease is not live."""

_NO_REPLY = "no renewal reply confirmed the lease before its deadline"


class MasterGroup(Protocol):
    """Several Redis masters renewed as one, by majority: a Redlock lock's
    ``MasterSet`` (``core/redlock/renewal.py``), which names its own sender."""

    quorum: int


RenewalClient: TypeAlias = "AnyRedisClient | MasterGroup"
"""What a lease is renewed through: a sync or asyncio Redis client, or a group of
Redlock masters."""


class EntryRenewer(Protocol):
    """The renewer of an entry (the sync one or an event loop's), told of explicit
    TTL changes of its leases."""

    def explicit(self, entry: Entry, ttl: float) -> int:
        """``entry``'s lease is about to be set to ``ttl`` s: its new generation."""
        ...

    def rescheduled(self, entry: Entry, sent_at: float, ttl: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on ``ttl``."""


class Renewable(Protocol):
    """What a lock or semaphore provides so that the renewer can renew its leases.

    ``_renew_script`` is a batch script: with N leases of k keys each, ``KEYS`` holds
    lease i's keys at ``KEYS[(i-1)*k+1 .. i*k]``, ``ARGV[1..N]`` the tokens and
    ``ARGV[N+1..2N]`` the new TTLs in milliseconds; it returns N integers, 1 when
    lease i was live and now expires TTL ms from the server's now, else 0. It never
    re-creates an expired lease, and running it twice is harmless.
    """

    @property
    def client(self) -> RenewalClient:
        """The client (or masters) the holder's keys live on."""
        ...

    @property
    def _renew_script(self) -> LuaScript:
        """The batch renewal script (see the class docs for its KEYS/ARGV)."""
        ...

    @property
    def _renew_keys(self) -> tuple[str, ...]:
        """The k keys of one lease, all in one hash slot; k is the same for a script."""
        ...


class Entry:
    """The renewer's record of one lease (the lease itself is held weakly)."""

    __slots__ = (
        "_keys",
        "_slot",
        "client",
        "dead",
        "error",
        "final",
        "gen",
        "holder",
        "inflight",
        "lease",
        "renewer",
        "script",
        "stop",
        "stop_at",
        "ticket",
        "token",
    )

    def __init__(
        self,
        lease: LeaseState,
        holder: Renewable,
        stop: Callable[[Entry], None],
        stop_at: float | None,
    ) -> None:
        # Made as a lease is granted (a task starting), so it only keeps references:
        # the keys and the cluster slot are worked out when first renewed (keys, slot).
        self.lease = weakref.ref(lease)
        self.token = lease.token
        self.holder = holder
        self.client = holder.client
        self.script = holder._renew_script
        self._keys: tuple[str, ...] | None = None
        self._slot: int | None = None
        self.stop = stop
        self.stop_at = stop_at  # monotonic instant renewal never goes past (max_hold)
        self.final = False  # no further renewal: max_hold reached
        self.inflight = False  # a renewal was sent and has not been answered yet
        self.dead = False  # released, lost or collected: forget it
        self.error = ""  # the last failed call's error, for the loss reason
        self.ticket = 0  # sequence number of the entry's current heap item
        self.gen = 0  # the lease's generation when its renewal was composed (collect)
        self.renewer: EntryRenewer | None = None  # for explicit TTL changes

    @property
    def keys(self) -> tuple[str, ...]:
        """The lease's keys, as the holder's renewal script takes them."""
        keys = self._keys
        if keys is None:
            keys = self._keys = tuple(self.holder._renew_keys)
        return keys

    @property
    def slot(self) -> int:
        """The keys' Redis Cluster hash slot (0 on a standalone server)."""
        slot = self._slot
        if slot is None:
            client = self.client
            if isinstance(client, (RedisCluster, AsyncRedisCluster)):
                slot = self._slot = client.keyslot(self.keys[0])
            else:
                slot = self._slot = 0
        return slot

    def __call__(self) -> None:
        """End renewal of the lease (the lease calls this on release)."""
        self.stop(self)

    def explicit(self, ttl: float) -> int:
        """The lease is about to be set to ``ttl`` s explicitly: the change's
        generation (0 without a renewer)."""
        return 0 if self.renewer is None else self.renewer.explicit(self, ttl)

    def rescheduled(self, sent_at: float, ttl: float) -> None:
        """The explicit change sent at ``sent_at`` was confirmed: renew on ``ttl``."""
        if self.renewer is not None:
            self.renewer.rescheduled(self, sent_at, ttl)


Reply = tuple[Entry, int, bool | None]
"""One lease's outcome of a call: the entry, the TTL sent (ms), renewed or not (None:
live, but an explicit extend sent later had set its TTL, left as it is)."""


HeapItem = tuple[float, int, float, Entry]
"""``(due, ticket, early, entry)``: the entry must be handled at ``due`` and may join
a tick from ``early`` on."""


def current(item: HeapItem) -> bool:
    """False for a heap item superseded by a later push, or of a dropped entry."""
    entry = item[3]
    return item[1] == entry.ticket and not entry.dead


def pop_superseded(heap: list[HeapItem]) -> None:
    """Pop superseded items off the top of ``heap``."""
    while heap and not current(heap[0]):
        heapq.heappop(heap)


def loss_reason(entry: Entry) -> str:
    """Why a lease whose deadline passed without a confirming reply is lost."""
    if entry.final:
        return "max_hold reached: renewal stopped and the lease expired"
    if entry.error:
        return f"{_NO_REPLY} (last error: {entry.error})"
    return f"{_NO_REPLY} (Redis did not answer in time)"


def report(lost: list[tuple[LeaseState, str]]) -> None:
    """Mark each lease lost (event, ``on_lost``); call without the renewer's lock."""
    for lease, reason in lost:
        # One event, one log line: a lease with an on_lost callback is reported by
        # its owner (the Celery layer logs an ERROR naming the task); only an
        # unwatched lease is logged here.
        level = logging.DEBUG if lease.on_lost is not None else logging.WARNING
        log.log(level, "celery_redislock: lease on %r lost: %s", lease.name, reason)
        try:
            lease._mark_lost(reason)
        except Exception:
            log.exception("celery_redislock: on_lost callback of %r failed", lease)


def restart_grace_ms(holder: object) -> int:
    """The restart grace (ms) a holder's leases are renewed with (see core/restart.py),
    0 for none: its scripts' ``grace`` (a lock's or a semaphore's)."""
    return int(getattr(getattr(holder, "_scripts", None), "grace", None) or 0)
