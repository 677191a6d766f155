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
from typing import Any

from ..errors import ConfigurationError
from .info import HolderInfo, PrimitiveInfo
from .keys import DEFAULT_PREFIX
from .lease import Lease, OnLost
from .primitive import Primitive, fresh_token
from .replicas import DEFAULT_REPLICA_TIMEOUT
from .scripts import LuaScript, as_text
from .validate import (
    acquire_deadline,
)
from .waiting import (
    WAITER_HEARTBEAT_MS,
    Grant,
    Notifier,
    granted_lease,
    poll_slice,
    wait_until_granted,
)

__all__ = ["BOOT_MARKER_MS", "FENCE_MEMORY_MS", "SCRIPT_CONSTANTS", "RedisLock"]

FENCE_MEMORY_MS = 3_600_000
"""How long a name's fence counter outlives its last grant (it then restarts from
the server's clock, which is already past every fence it granted)."""

BOOT_MARKER_MS = 86_400_000
"""How long a Redlock master's boot marker is kept (see ``core/redlock``); once it
lapses the next acquire checks the server's uptime again and sets it anew."""

SCRIPT_CONSTANTS = {
    "BOOT_MARKER_MS": BOOT_MARKER_MS,
    "FENCE_MEMORY_MS": FENCE_MEMORY_MS,
    "WAITER_HEARTBEAT_MS": WAITER_HEARTBEAT_MS,
}
"""The ``{{NAME}}`` constants of the lock and semaphore scripts (see lib_lock.lua):
written into their text at import rather than sent with every call."""

_ACQUIRE = LuaScript("lock_acquire.lua", SCRIPT_CONSTANTS)
_RELEASE = LuaScript("lock_release.lua", SCRIPT_CONSTANTS)
_EXTEND = LuaScript("lock_extend.lua", SCRIPT_CONSTANTS)
_ADOPT = LuaScript("lock_adopt.lua", SCRIPT_CONSTANTS)
_LEAVE = LuaScript("queue_leave.lua", SCRIPT_CONSTANTS)
_INFO = LuaScript("lock_info.lua", SCRIPT_CONSTANTS)
_RELEASE_OWNER = LuaScript("lock_release_owner.lua", SCRIPT_CONSTANTS)
_RENEW = LuaScript("lock_renew.lua", SCRIPT_CONSTANTS)
_HELD = LuaScript("lock_held.lua", SCRIPT_CONSTANTS)
_EXTEND_ADD = LuaScript("lock_extend_add.lua", SCRIPT_CONSTANTS)

# Constant script argument, encoded once (see RedisLock.__init__).
_WAIT = b"1"


def _grant_of(answer: Any, sent_at: float, ttl_ms: int) -> Grant | None:
    """The grant in a ``lock_acquire.lua`` reply to an attempt sent at ``sent_at``, or
    None when it was refused (``{0, wait_ms, holder}``)."""
    if isinstance(answer, int):
        return answer, sent_at  # a new lease: its fence, its full TTL left
    if answer[0] == 1:  # a lease this token holds already (a re-sent request, a grant)
        return granted_lease(int(answer[1]), sent_at, int(answer[2]), ttl_ms)
    return None


class RedisLock(Primitive):
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
    """

    kind = "lock"

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        ttl: float = 30.0,
        prefix: str = DEFAULT_PREFIX,
        renew: bool = False,
        max_hold: float | None = None,
        min_replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
        wait_aof: bool = False,
    ) -> None:
        super().__init__(client, name, ttl=ttl, prefix=prefix, renew=renew, max_hold=max_hold,
                         min_replicas=min_replicas, replica_timeout=replica_timeout,
                         wait_aof=wait_aof)  # fmt: skip
        # The hot path sends these as they are: keys encoded once with the client's own
        # encoder (what redis-py would send for the str), not per call. The scripts
        # derive the wake-up channel from the holders key (KeySpace.channel).
        encode = self._client.get_encoder().encode
        keys = self._keys
        holders, fence, queue, alive, asks = (
            encode(key) for key in (keys.holders, keys.fence, keys.queue, keys.alive, keys.asks)
        )
        self._acquire_keys: list[Any] = [holders, fence, queue, alive, asks]
        self._release_keys = [holders, queue, alive, asks, fence]
        self._queue_keys = [holders, queue, alive, asks]
        self._adopt_keys = [holders, fence]
        self._holders_key = [holders]
        self._channel = keys.channel

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
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        token, tag = fresh_token(self._client)
        channel = f"{self._channel}:{tag}"
        reply: list[Any] = [0, 0, b""]
        grant: Grant | None = None
        if (
            deadline is not None
            and deadline > time.monotonic()  # not given up already: it may queue
            and Notifier.for_client(self._client).subscribed(channel)
        ):
            # Waited here lately: the wake-ups are heard already, so the first
            # attempt may queue at once (one round trip per wait saved).
            grant = self._wait(token, owner, ttl_ms, channel, reply, deadline)
        else:
            # The first attempt is inline: the uncontended path makes no closure. The
            # script's trailing defaults (no owner, no wait) are left out.
            args: list[Any] = [token, ttl_ms, owner] if owner else [token, ttl_ms]
            sent_at = time.monotonic()
            answer = _ACQUIRE(self._client, self._acquire_keys, args)
            grant = _grant_of(answer, sent_at, ttl_ms)
            if grant is None:
                reply = answer
                if deadline is not None and deadline > time.monotonic():
                    grant = self._wait(token, owner, ttl_ms, channel, reply, deadline)
        if grant is None:  # refused (blocking=False, timeout=0) or timed out
            return None, as_text(reply[2]) or None
        lease = self._new_lease(token, grant[0], ttl_ms, owner, grant[1], renew, on_lost,
                                max_hold)  # fmt: skip
        return lease, None

    def _wait(self, token: str, owner: str | None, ttl_ms: int, channel: str,
              reply: list[Any], deadline: float) -> Grant | None:  # fmt: skip
        """Queue as ``token`` until granted (see :func:`.waiting.wait_until_granted`);
        ``reply`` keeps the last refusal (its holder's owner id)."""
        client = self._client
        args = [token, ttl_ms, owner or "", _WAIT]  # each attempt joins (or stays in) the queue

        def attempt() -> Grant | int:
            sent_at = time.monotonic()
            answer = _ACQUIRE(client, self._acquire_keys, args)
            grant = _grant_of(answer, sent_at, ttl_ms)
            if grant is not None:
                return grant
            reply[:] = answer
            return int(answer[1])  # refused: the holder's TTL left, ms

        def leave() -> int:
            left = _LEAVE(client, self._queue_keys, [token, "lock"])
            return int(left[1])

        return wait_until_granted(
            client, channel, token, attempt, leave,
            lambda: self._release_token(token), None if deadline == math.inf else deadline,
            poll_slice(ttl_ms),
        )  # fmt: skip

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
        sent_at = time.monotonic()
        granted, fence = _ADOPT(
            self._client, self._adopt_keys, [token, new_token, ttl_ms, owner or ""]
        )
        if granted != 1:
            return None
        return self._new_lease(
            new_token, int(fence), ttl_ms, owner, sent_at, renew, on_lost, max_hold
        )

    def release_owner(self, owner: str) -> int:
        """Release every lease of the lock if its owner id is ``owner``.

        For code that knows the owner but holds no lease (an operator, a process that
        cleans up after a dead one). Returns the number of leases released.
        """
        if not isinstance(owner, str) or not owner:
            raise ConfigurationError(f"owner must be a non-empty string, got {owner!r}")
        return self._release_owner(owner)

    def force_release(self) -> int:
        """Release the lock whoever holds it; returns the number of leases released.

        The holders' leases report themselves lost at their next renewal, release or
        extend. Meant for operators clearing a stuck lock, never for normal flow.
        """
        return self._release_owner("")

    def _release_owner(self, owner: str) -> int:
        return int(_RELEASE_OWNER(self._client, self._queue_keys, [owner]))

    def locked(self) -> bool:
        """True while any lease holds the lock."""
        return bool(self._client.exists(self._keys.holders))

    def info(self) -> PrimitiveInfo:
        """The lock's holders, owner, fence and number of waiters, read-only."""
        now_ms, flat, waiters = _INFO(self._client, [self._keys.holders, self._keys.queue], [])
        fields = {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}
        holders = [
            HolderInfo(
                token_hint=name[2:10],
                ttl_left=(int(value) - now_ms) / 1000.0,
                fence=int(fields.get("f:" + name[2:], "0")),
                owner=fields.get("owner") or None,
            )
            for name, value in fields.items()
            if name.startswith("t:") and int(value) > now_ms
        ]
        return PrimitiveInfo(
            kind="lock",
            name=self.name,
            holders=holders,
            waiters=int(waiters),
            owner=(fields.get("owner") or None) if holders else None,
            since=int(fields["since"]) / 1000.0 if holders and "since" in fields else None,
            fence=int(fields["fence"]) if holders and "fence" in fields else None,
        )

    def __repr__(self) -> str:
        return f"<RedisLock {self.name!r} ttl={self.ttl}>"

    # -- the lease's side (LeaseHolder) -----------------------------------------------

    def _release_token(self, token: str) -> bool:
        return bool(_RELEASE(self._client, self._release_keys, [token]))

    def _extend_token(self, token: str, ttl_ms: int) -> bool:
        return bool(_EXTEND(self._client, self._holders_key, [token, ttl_ms]))

    def _held_token(self, token: str) -> int:
        return int(_HELD(self._client, self._holders_key, [token]))

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str) -> int:
        keys = [self._keys.holders, self._keys.added]
        return int(_EXTEND_ADD(self._client, keys, [token, ttl_ms, nonce]))

    def _hold_attempt(
        self, blocking: bool, timeout: float | None, owner: str | None, ttl: float | None,
        renew: bool | None, on_lost: OnLost | None, max_hold: float | None,
    ) -> tuple[Lease | None, str | None]:  # fmt: skip
        deadline = acquire_deadline(blocking, timeout)
        return self._acquire(deadline, owner, ttl, renew, on_lost, max_hold)

    def _extend_call(self, token: str, ttl_ms: int) -> tuple[LuaScript, list[Any], list[Any]]:
        return _EXTEND, self._holders_key, [token, ttl_ms]

    # -- the renewer's side (renewal.Renewable) ---------------------------------------

    _renew_script = _RENEW

    @property
    def _renew_keys(self) -> tuple[str, ...]:
        return (self._keys.holders,)
