"""``RedisSemaphore``: at most ``limit`` leases of a name are live at any instant.

One Lua script per operation (see :mod:`.semaphore_scripts`), one round trip each
when uncontended. Live leases are a sorted set scored by their expiry on the
server's clock; every script drops expired ones first, so a crashed holder's permit
returns when its TTL runs out. Blocked acquirers queue (see :mod:`.waiting`); a
release grants the permits it frees to the first waiters itself and tells each by a
message to its own process (no herd, and no round trip for the waiter).
"""

from __future__ import annotations

import logging
import math
import time

from redis.typing import EncodableT, KeyT

from .info import PrimitiveInfo
from .keys import DEFAULT_PREFIX
from .lease import Lease, OnLost
from .operations import run
from .primitive import ServerPrimitive, fresh_token
from .replicas import DEFAULT_REPLICA_TIMEOUT
from .restart import grace_ms
from .scripts import LuaScript, RedisClient, reply_deadline
from .semaphore_scripts import (
    ACQUIRE,
    RENEW,
    SemaphoreScripts,
    acquire_reply,
    attempt_outcome,
)
from .validate import (
    acquire_deadline,
    check_bool,
    check_positive_int,
)
from .waiting import Grant, Notifier, poll_slice, wait_until_granted

__all__ = ["RedisSemaphore"]

log = logging.getLogger(__name__)


class RedisSemaphore(ServerPrimitive):
    """A named counting semaphore shared by every process that uses the same Redis.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        name: any non-empty string; all of the semaphore's keys share one hash tag.
        limit: the most leases that may be live at once (an int >= 1).
        ttl: lease time in seconds (millisecond precision); a lease not released,
            extended or renewed within it expires and its permit returns.
        fair: grant strictly in request order: only the first waiter of the queue may
            take a permit. Otherwise any of the first ``free`` waiters may, and so may
            a newcomer (it barges in) unless the longest waiter has already waited
            :data:`~.semaphore_scripts.PATIENCE_MS`, so nobody is overtaken for long.
            Every client of a name should use the same setting.
        prefix: first part of every key.
        renew: renew leases in the background while held (see :mod:`.renewal`).
        max_hold: seconds after its grant beyond which a lease is never held (its TTL
            is capped to it and renewal stops there), as for ``RedisLock``; None: no
            bound.
        min_replicas, replica_timeout, wait_aof: replica acknowledgement of grants,
            as for ``RedisLock`` (see :mod:`.replicas`).
        restart_grace: after Redis lost its data, how long permits are held for their
            holders from before, which renewal puts back (see :mod:`.restart`): None
            (default) -- not; True -- one renewal period plus 2 s, at most ``ttl``;
            seconds, at least 2 (``restart.MIN_GRACE``).

    The limit rule: every acquire enforces the ``limit`` of the semaphore object that
    calls it, and stores it with the semaphore (its ``meta`` hash, which releases read
    to decide whom to wake and :meth:`info` reports). So a limit changed in
    configuration takes effect with the first acquire under the new configuration
    (logged as a warning, once per object). A lowered limit never revokes current
    leases: new grants wait until fewer than ``limit`` are live. While processes
    disagree (a rolling deploy), each grant obeys its asker's limit, so the number
    of live leases never exceeds the largest limit in use.
    """

    kind = "semaphore"
    _scripts: SemaphoreScripts

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        limit: int,
        ttl: float = 30.0,
        fair: bool = False,
        prefix: str = DEFAULT_PREFIX,
        renew: bool = False,
        max_hold: float | None = None,
        min_replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
        wait_aof: bool = False,
        restart_grace: float | bool | None = None,
    ) -> None:
        super().__init__(
            client,
            name,
            ttl=ttl,
            prefix=prefix,
            renew=renew,
            max_hold=max_hold,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            wait_aof=wait_aof,
        )
        self._limit = check_positive_int(limit, "limit")
        self._fair = check_bool(fair, "fair")
        self._restart_grace_ms = grace_ms(restart_grace, self._ttl_ms, self._client)
        self._scripts = SemaphoreScripts(
            self._client, self._keys, self._limit, self._fair, self._restart_grace_ms
        )

    @property
    def limit(self) -> int:
        """The limit this object enforces (and stores) when it acquires."""
        return self._limit

    @property
    def fair(self) -> bool:
        """True when permits are granted strictly in request order."""
        return self._fair

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> Lease | None:
        """Take a permit; return its :class:`Lease`, or None if not granted in time.

        ``blocking=False`` (or ``timeout=0``) tries once. Otherwise waits up to
        ``timeout`` seconds (None: for ever). ``owner`` (e.g. a Celery task id) is
        recorded with the lease for inspection; every acquire is a permit of its own.
        ``ttl``, ``renew`` and ``max_hold`` default to the semaphore's; ``on_lost(lease)``
        runs once if the lease is found lost (see :mod:`.renewal`).
        """
        deadline = acquire_deadline(blocking, timeout)
        if deadline is None or deadline == math.inf:
            return self._acquire_by(deadline, owner, ttl, renew, on_lost, max_hold)
        with reply_deadline(deadline):  # no blocked read outlives the caller's deadline
            return self._acquire_by(deadline, owner, ttl, renew, on_lost, max_hold)

    def _acquire_by(
        self,
        deadline: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: OnLost | None,
        max_hold: float | None,
    ) -> Lease | None:
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        self._prepare_renewal(renew)
        token, tag = fresh_token(self._client)

        def attempt() -> Grant | int:
            sent_at = time.monotonic()
            reply = self._attempt(token, owner or "", ttl_ms, deadline is not None)
            return attempt_outcome(reply, sent_at, ttl_ms)

        # Listening before the first attempt saves the re-check after subscribing, but
        # costs a subscription: worth it only when the channel is subscribed already
        # (this process waited here lately).
        channel = f"{self._scripts.channel}:{tag}"
        grant: Grant | int | None = None
        acked: list[object] = []
        if deadline is None or not Notifier.for_client(self._client).subscribed(channel):
            sent_at = time.monotonic()
            reply = self._attempt(token, owner or "", ttl_ms, deadline is not None, acked)
            grant = attempt_outcome(reply, sent_at, ttl_ms)
        if not isinstance(grant, tuple):
            if deadline is None:
                return None
            grant = wait_until_granted(
                self._client,
                channel,
                token,
                attempt,
                lambda: self._leave(token),
                lambda: self._release_token(token),
                None if deadline == math.inf else deadline,
                poll_slice(ttl_ms),
            )
            if grant is None:
                return None
        return self._new_lease(
            token,
            grant[0],
            ttl_ms,
            owner,
            grant[1],
            renew,
            on_lost,
            max_hold,
            acked[0] if acked else None,
        )

    def available(self) -> int:
        """Permits not held by a live lease, under this object's limit (read-only).

        Queued waiters may be about to take them.
        """
        return max(0, self._limit - len(self.info().holders))

    def info(self) -> PrimitiveInfo:
        """Live leases with their TTL left, the waiters and the stored limit, read-only."""
        return run(self._client, self._scripts.info(self.name, self._limit))

    def __repr__(self) -> str:
        fair = " fair" if self._fair else ""
        return f"<RedisSemaphore {self.name!r} limit={self._limit} ttl={self.ttl}{fair}>"

    # -- one round trip each ---------------------------------------------------------

    def _attempt(
        self, token: str, owner: str, ttl_ms: int, wait: bool, acked: list[object] | None = None
    ) -> tuple[int, int, int, int]:
        """One acquire round trip (see :func:`.semaphore_scripts.acquire_reply`). With
        ``acked`` (a first attempt) and ``min_replicas``, the WAIT goes in the same
        round trip; its answer is appended when this call wrote a new lease."""
        scripts = self._scripts
        if acked is None or self._ack is None:
            return run(self._client, scripts.attempt(token, owner, ttl_ms, wait))[0]
        run(self._client, scripts.marking())  # see .replicas
        keys, args = scripts.acquire_keys, scripts.acquire_args(token, owner, ttl_ms, wait)
        raw, answer = self._ack.run(self._client, ACQUIRE, keys, args)
        reply = scripts.limit_checked(acquire_reply(raw))
        if reply[0] and reply[3] == ttl_ms:  # a new lease, written by this call
            acked.append(answer)
        return reply

    def _extend_call(
        self, token: str, ttl_ms: int
    ) -> tuple[LuaScript, list[KeyT], list[EncodableT]]:
        return self._scripts.extend_call(token, ttl_ms)

    # -- the renewer's side (renewal.Renewable) ---------------------------------------

    _renew_script: LuaScript = RENEW

    @property
    def _renew_keys(self) -> tuple[str, str]:
        return (self._keys.holders, self._keys.leases)
