"""``AsyncRedisLock``: the lock of :class:`~celery_redislock.core.lock.RedisLock` for
``redis.asyncio`` clients.

Same scripts, keys, arguments and reply reading (:mod:`~celery_redislock.core.
lock_scripts`), same waiting decisions; only the calls are awaited. A sync and an
async client on the same name share one lock: they exclude each other, queue in one
FIFO and hand the lock to each other.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Callable

from ..core.clients import AsyncRedisClient
from ..core.info import PrimitiveInfo
from ..core.keys import DEFAULT_PREFIX
from ..core.lock_scripts import RENEW, LockScripts, ReplyArray, acquire_reply, refused_holder
from ..core.primitive import fresh_token
from ..core.replicas import DEFAULT_REPLICA_TIMEOUT
from ..core.scripts import reply_array, reply_deadline, sees_resends
from ..core.validate import acquire_deadline
from ..core.waiting import Grant, poll_slice
from ..errors import ConfigurationError
from .calls import run
from .lease import AsyncLease, AsyncOnLost
from .notifier import AsyncNotifier
from .primitive import AsyncPrimitive, cancel_check
from .waiting import wait_until_granted

__all__ = ["AsyncRedisLock"]

_UNCAPPED = contextlib.nullcontext()  # no reply deadline (reusable: it has no state)


class AsyncRedisLock(AsyncPrimitive):
    """A named lock for async code, shared with every sync and async client of the
    same Redis. Takes the arguments of :class:`~celery_redislock.core.lock.RedisLock`
    (``client`` a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``),
    ``restart_grace`` included; ``min_replicas`` / ``wait_aof`` are not supported
    yet."""

    kind = "lock"
    _scripts: LockScripts

    def __init__(
        self,
        client: AsyncRedisClient,
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
        self._scripts = scripts = LockScripts(self._client, self._keys, restart_grace, self._ttl_ms)
        self._acquire_keys = scripts.acquire_keys
        self._channel = scripts.channel

    async def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
        max_hold: float | None = None,
    ) -> AsyncLease | None:
        """Take the lock; the :class:`AsyncLease`, or None if not granted in time.

        As :meth:`RedisLock.acquire <celery_redislock.core.lock.RedisLock.acquire>`:
        FIFO with every other waiter (sync or async), counted re-entry for the same
        ``owner``. Cancelled at any ``await``, it leaves no lease and no queued waiter
        behind (see :mod:`.primitive`).
        """
        lease, _ = await self._acquire(
            acquire_deadline(blocking, timeout), owner, ttl, renew, on_lost, max_hold
        )
        return lease

    async def try_acquire(
        self,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
        max_hold: float | None = None,
    ) -> tuple[AsyncLease | None, str | None]:
        """One attempt that never waits: ``(lease, None)`` or ``(None, holder's owner)``."""
        return await self._acquire(None, owner, ttl, renew, on_lost, max_hold)

    async def _acquire(
        self,
        deadline: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: AsyncOnLost | None,
        max_hold: float | None,
    ) -> tuple[AsyncLease | None, str | None]:
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        token, tag = fresh_token()  # classic pub/sub: the async notifier's
        channel = f"{self._channel}:{tag}"
        reply: ReplyArray = [0, 0, b""]
        check = cancel_check()
        capped = deadline is not None and deadline != math.inf
        try:
            # As the sync lock: no blocked read outlives the caller's deadline.
            with reply_deadline(deadline) if capped else _UNCAPPED:
                # Queued at once when this loop already listens on the channel (a
                # loop that never waited has no subscriber: none is made here).
                notifier = None if deadline is None else AsyncNotifier.current(self._client)
                if (
                    deadline is not None
                    and notifier is not None
                    and notifier.subscribed(channel)
                    and deadline > time.monotonic()
                ):
                    grant = await self._wait(token, owner, ttl_ms, channel, reply, deadline, check)
                else:
                    operation = self._scripts.attempt(token, ttl_ms, owner)
                    answer, sent_at = await run(self._client, operation)
                    check()
                    grant = acquire_reply(answer, sent_at, ttl_ms)
                    if grant is None:
                        reply = reply_array(answer)  # a refusal
                        if deadline is not None and deadline > time.monotonic():
                            grant = await self._wait(
                                token, owner, ttl_ms, channel, reply, deadline, check
                            )
                check()
        except BaseException:
            await self._give_up(token)
            raise
        if grant is None:
            return None, refused_holder(reply)
        lease = self._new_lease(token, grant[0], ttl_ms, owner, grant[1], renew, on_lost, max_hold)
        return lease, None

    async def _wait(
        self,
        token: str,
        owner: str | None,
        ttl_ms: int,
        channel: str,
        reply: ReplyArray,
        deadline: float,
        check: Callable[[], None],
    ) -> Grant | None:
        client, scripts = self._client, self._scripts

        async def attempt() -> Grant | int:
            outcome = await run(client, scripts.queued_attempt(token, ttl_ms, owner, reply))
            check()
            return outcome

        return await wait_until_granted(
            AsyncNotifier.for_client(client),
            channel,
            token,
            attempt,
            lambda: self._leave(token),
            None if deadline == math.inf else deadline,
            poll_slice(ttl_ms),
        )

    async def adopt(
        self,
        token: str,
        *,
        new_token: str | None = None,
        owner: str | None = None,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
        max_hold: float | None = None,
    ) -> AsyncLease | None:
        """Take over the live lease ``token`` (as :meth:`RedisLock.adopt
        <celery_redislock.core.lock.RedisLock.adopt>`); None when it is not live."""
        for argument, value in (("token", token), ("new_token", new_token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"{argument} must be a non-empty string, got {value!r}")
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        new_token = new_token or secrets.token_hex(16)
        grant = await run(self._client, self._scripts.adopt(token, new_token, ttl_ms, owner))
        if grant is None:
            return None
        return self._new_lease(
            new_token, grant[0], ttl_ms, owner, grant[1], renew, on_lost, max_hold
        )

    async def locked(self) -> bool:
        """True while any lease holds the lock."""
        return bool(await self._client.exists(self._keys.holders))

    async def info(self) -> PrimitiveInfo:
        """The lock's holders, owner, fence and number of waiters, read-only."""
        return await run(self._client, self._scripts.info(self.name))

    async def _hold_attempt(
        self,
        blocking: bool,
        timeout: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: AsyncOnLost | None,
        max_hold: float | None,
    ) -> tuple[AsyncLease | None, str | None]:
        deadline = acquire_deadline(blocking, timeout)
        return await self._acquire(deadline, owner, ttl, renew, on_lost, max_hold)

    def __repr__(self) -> str:
        return f"<AsyncRedisLock {self.name!r} ttl={self.ttl}>"

    async def _release_lease(self, token: str, deadline: float) -> bool:
        # As the sync lock's: where a call sees its own re-sends the common release
        # writes no record for one, which judges a lease found gone by its deadline.
        judge = deadline if sees_resends(self._client) else None
        return await run(self._client, self._scripts.release(token, judge))

    # -- the renewer's side (renewal.Renewable) ---------------------------------------

    _renew_script = RENEW

    @property
    def _renew_keys(self) -> tuple[str, ...]:
        return (self._keys.holders,)
