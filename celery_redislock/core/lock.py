"""``RedisLock``: a mutual-exclusion lock on Redis, owned by a token.

One Lua script per operation (``lua/lock_*.lua``), one round trip each when
uncontended. Waiters queue in FIFO order; a release grants the lock to the first
one and tells it so by a message (see :mod:`.waiting`), so a hand-off costs the
waiter no round trip; a bounded fallback poll covers lost messages, and a crashed
holder's lock passes on when its TTL runs out.
"""

from __future__ import annotations

import math
import secrets
import time

from redis.typing import EncodableT, KeyT

from ..errors import ConfigurationError
from .info import PrimitiveInfo
from .keys import DEFAULT_PREFIX
from .lease import Lease, OnLost
from .lock_scripts import (
    ACQUIRE,
    BOOT_MARKER_MS,
    EXTEND,
    FENCE_MEMORY_MS,
    RELEASE_MEMORY_MS,
    RENEW,
    SCRIPT_CONSTANTS,
    LockScripts,
    ReplyArray,
    acquire_reply,
    refused_holder,
)
from .operations import run
from .primitive import ServerPrimitive, fresh_token
from .replicas import DEFAULT_REPLICA_TIMEOUT
from .scripts import LuaScript, RedisClient, reply_array, reply_deadline, sees_resends
from .validate import acquire_deadline
from .waiting import Grant, Notifier, poll_slice, wait_until_granted

__all__ = [
    "BOOT_MARKER_MS",
    "FENCE_MEMORY_MS",
    "RELEASE_MEMORY_MS",
    "SCRIPT_CONSTANTS",
    "RedisLock",
]


class RedisLock(ServerPrimitive):
    """A named lock shared by every process that uses the same Redis.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        name: any non-empty string; all of the lock's keys share one hash tag.
        ttl: lease time in seconds (millisecond precision); a lease not released,
            extended or renewed within it expires.
        prefix: first part of every key.
        renew: renew leases in the background while held (see :mod:`.renewal`).
        max_hold: seconds after its grant beyond which a lease is never held: its TTL
            is capped to it and renewal stops there (the lease then expires and is
            reported lost). None: no bound. An explicit ``extend()`` is not bounded.
        min_replicas: a grant counts only once ``WAIT`` reports this many replicas
            within ``replica_timeout`` seconds; else it is released and
            :class:`~celery_redislock.errors.NotReplicated` raised (see
            :mod:`.replicas`). 0: grants count at once. Releases never wait.
        replica_timeout: seconds a grant waits for its replicas (> 0).
        wait_aof: confirm with ``WAITAOF 1 min_replicas`` (Redis >= 7.2, AOF on)
            instead of ``WAIT``.
        restart_grace: as for ``RedisSemaphore`` (see :mod:`.restart`); a free lock
            is then refused with :class:`~celery_redislock.errors.RedisRestarting`.
    """

    kind = "lock"
    _scripts: LockScripts

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float = 30.0,
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
        # Keys encoded once; arguments and replies read as the async lock reads them.
        self._scripts = scripts = LockScripts(self._client, self._keys, restart_grace, self._ttl_ms)
        self._acquire_keys = scripts.acquire_keys  # the hot path's, read directly

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
        """Take the lock; return the :class:`Lease`, or None if not granted in time.

        ``blocking=False`` (or ``timeout=0``) tries once. Otherwise waits up to
        ``timeout`` seconds (None: for ever), in FIFO order with other waiters. With an
        ``owner`` id, the same owner may acquire again while it holds the lock; each
        acquisition is a lease of its own, and the lock is held until every one is
        released or expired.
        ``ttl``, ``renew`` and ``max_hold`` default to the lock's; ``on_lost(lease)``
        runs once if the lease is found lost (see :mod:`.renewal`).
        """
        lease, _ = self._acquire(
            acquire_deadline(blocking, timeout), owner, ttl, renew, on_lost, max_hold
        )
        return lease

    def try_acquire(
        self,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> tuple[Lease | None, str | None]:
        """One attempt that never waits, telling who holds the lock when refused.

        Returns ``(lease, None)`` when granted, ``(None, owner_id)`` when refused
        (``owner_id`` is None when the holder gave none, or when the lock is free but
        promised to an earlier waiter). Costs the same single round trip as
        ``acquire(blocking=False)``.
        """
        return self._acquire(None, owner, ttl, renew, on_lost, max_hold)

    def _acquire(
        self,
        deadline: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: OnLost | None,
        max_hold: float | None,
    ) -> tuple[Lease | None, str | None]:
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
    ) -> tuple[Lease | None, str | None]:
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        if self.renew if renew is None else renew:  # (a queued lease never is: no call)
            self._prepare_renewal(renew)
        token, tag = fresh_token(self._client)
        channel = f"{self._keys.channel}:{tag}"
        reply: ReplyArray = [0, 0, b""]
        grant: Grant | None = None
        acked: object = None
        if (
            deadline is not None
            and deadline > time.monotonic()  # not given up already: it may queue
            and Notifier.for_client(self._client).subscribed(channel)
        ):
            # Waited here lately: the wake-ups are heard already, so the first
            # attempt may queue at once (one round trip per wait saved).
            grant = self._wait(token, owner, ttl_ms, channel, reply, deadline)
        else:
            if self._ack is None:
                answer, sent_at = run(self._client, self._scripts.attempt(token, ttl_ms, owner))
            else:  # the grant and its WAIT in one round trip (see .replicas)
                run(self._client, self._scripts.marking())
                args = self._scripts.acquire_args(token, ttl_ms, owner)
                sent_at = time.monotonic()
                answer, acked = self._ack.run(self._client, ACQUIRE, self._acquire_keys, args)
                if not isinstance(answer, int):
                    acked = None  # no new lease written by this call: confirmed apart
            grant = acquire_reply(answer, sent_at, ttl_ms)
            if grant is None:
                reply = reply_array(answer)  # a refusal
                if deadline is not None and deadline > time.monotonic():
                    grant = self._wait(token, owner, ttl_ms, channel, reply, deadline)
        if grant is None:  # refused (blocking=False, timeout=0) or timed out
            return None, refused_holder(reply)
        lease = self._new_lease(
            token, grant[0], ttl_ms, owner, grant[1], renew, on_lost, max_hold, acked
        )
        return lease, None

    def _wait(
        self,
        token: str,
        owner: str | None,
        ttl_ms: int,
        channel: str,
        reply: ReplyArray,
        deadline: float,
    ) -> Grant | None:
        """Queue as ``token`` until granted (see :func:`.waiting.wait_until_granted`);
        ``reply`` keeps the last refusal (its holder's owner id)."""
        client = self._client
        scripts = self._scripts
        return wait_until_granted(
            client,
            channel,
            token,
            lambda: run(client, scripts.queued_attempt(token, ttl_ms, owner, reply)),
            lambda: self._leave(token),
            lambda: self._release_token(token),
            None if deadline == math.inf else deadline,
            poll_slice(ttl_ms),
        )

    def adopt(
        self,
        token: str,
        *,
        new_token: str | None = None,
        owner: str | None = None,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> Lease | None:
        """Take over the live lease ``token`` (e.g. handed over in a message header).

        Returns a fresh lease that replaces it, or None when ``token`` is no longer
        live (already taken over, released or expired). Never waits. ``new_token``
        lets the caller choose the new lease's token (e.g. derived from ``token``, so
        another process can compute it to release the lease); None when that token
        already holds the lock, so one hand-over can never be taken twice. ``owner``
        replaces the lock's owner id (None keeps it).
        """
        for argument, value in (("token", token), ("new_token", new_token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"{argument} must be a non-empty string, got {value!r}")
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        new_token = new_token or secrets.token_hex(16)
        grant = run(self._client, self._scripts.adopt(token, new_token, ttl_ms, owner))
        if grant is None:
            return None
        return self._new_lease(
            new_token, grant[0], ttl_ms, owner, grant[1], renew, on_lost, max_hold
        )

    def __repr__(self) -> str:
        return f"<RedisLock {self.name!r} ttl={self.ttl}>"

    def _release_lease(self, token: str, deadline: float) -> bool:
        # On a plain client the common release writes no record for a re-send, which
        # judges a lease found gone by the lease's deadline instead (see
        # lock_scripts.release_reply); elsewhere the release is recorded.
        judge = deadline if sees_resends(self._client) else None
        return run(self._client, self._scripts.release(token, judge))

    def locked(self) -> bool:
        """True while any lease holds the lock."""
        return bool(self._client.exists(self._keys.holders))

    def info(self) -> PrimitiveInfo:
        """The lock's holders, owner, fence and number of waiters, read-only."""
        return run(self._client, self._scripts.info(self.name))

    def _hold_attempt(
        self,
        blocking: bool,
        timeout: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: OnLost | None,
        max_hold: float | None,
    ) -> tuple[Lease | None, str | None]:
        deadline = acquire_deadline(blocking, timeout)
        return self._acquire(deadline, owner, ttl, renew, on_lost, max_hold)

    def _extend_call(
        self, token: str, ttl_ms: int
    ) -> tuple[LuaScript, list[KeyT], list[EncodableT]]:
        return EXTEND, self._scripts.holders_key, [token, ttl_ms]

    # -- the renewer's side (renewal.Renewable) ---------------------------------------

    _renew_script = RENEW

    @property
    def _renew_keys(self) -> tuple[str, ...]:
        return (self._keys.holders,)
