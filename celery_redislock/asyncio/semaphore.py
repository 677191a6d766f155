"""``AsyncRedisSemaphore``: the semaphore of :class:`~celery_redislock.core.semaphore.
RedisSemaphore` for ``redis.asyncio`` clients.

Same scripts, keys, arguments and reply reading (:mod:`~celery_redislock.core.
semaphore_scripts`), same waiting decisions; only the calls are awaited. Sync and
async clients of one name share its permits and its queue.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

from ..core.clients import AsyncRedisClient
from ..core.info import PrimitiveInfo
from ..core.keys import DEFAULT_PREFIX
from ..core.primitive import fresh_token
from ..core.replicas import DEFAULT_REPLICA_TIMEOUT
from ..core.restart import grace_ms
from ..core.scripts import reply_deadline
from ..core.semaphore_scripts import (
    RENEW,
    SemaphoreScripts,
    attempt_outcome,
)
from ..core.validate import acquire_deadline, check_bool, check_positive_int
from ..core.waiting import Grant, poll_slice
from .calls import run
from .lease import AsyncLease, AsyncOnLost
from .notifier import AsyncNotifier
from .primitive import AsyncPrimitive, cancel_check
from .waiting import wait_until_granted

__all__ = ["AsyncRedisSemaphore"]

log = logging.getLogger(__name__)


class AsyncRedisSemaphore(AsyncPrimitive):
    """A named counting semaphore for async code, shared with every sync and async
    client of the same Redis. Takes the arguments of :class:`~celery_redislock.core.
    semaphore.RedisSemaphore` (``client`` a ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``), ``restart_grace`` included; ``min_replicas`` /
    ``wait_aof`` are not supported yet."""

    kind = "semaphore"
    _scripts: SemaphoreScripts

    def __init__(
        self,
        client: AsyncRedisClient,
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
        """Take a permit; its :class:`AsyncLease`, or None if not granted in time (as
        :meth:`RedisSemaphore.acquire <celery_redislock.core.semaphore.RedisSemaphore.
        acquire>`). Cancelled at any ``await``, it leaves no permit and no queued waiter
        behind (see :mod:`.primitive`)."""
        deadline = acquire_deadline(blocking, timeout)
        ttl_ms, max_hold = self._lease_terms(ttl, max_hold, owner)
        wait = deadline is not None
        notifier = AsyncNotifier.for_client(self._client) if wait else None
        token = fresh_token()[0] if notifier is None else notifier.fresh_token()
        check = cancel_check()

        async def attempt() -> Grant | int:
            sent_at = time.monotonic()
            reply = await self._attempt(token, owner or "", ttl_ms, wait)
            check()
            return attempt_outcome(reply, sent_at, ttl_ms)

        channel = "" if notifier is None else f"{self._scripts.channel}:{notifier.tag}"
        grant: Grant | int | None = None
        capped = deadline is not None and deadline != math.inf
        try:
            # As the sync semaphore: no blocked read outlives the caller's deadline.
            with reply_deadline(deadline) if capped else contextlib.nullcontext():
                if notifier is None:
                    grant = await attempt()
                elif notifier.alone(channel, self._limit):
                    # Nobody of this loop waits, fewer than `limit` try: one try before
                    # subscribing, so a burst's first `limit` acquires are granted
                    # together (else the try waits for the subscription: a refused try
                    # made before it must be made again once subscribed, see waiting.py).
                    with notifier.trying(channel):
                        grant = await attempt()
                if not isinstance(grant, tuple):
                    if notifier is None or deadline is None:
                        return None
                    grant = await wait_until_granted(
                        notifier,
                        channel,
                        token,
                        attempt,
                        lambda: self._leave(token),
                        None if deadline == math.inf else deadline,
                        poll_slice(ttl_ms),
                    )
                check()
                if grant is None:
                    return None
        except BaseException:
            await self._give_up(token)
            raise
        return self._new_lease(token, grant[0], ttl_ms, owner, grant[1], renew, on_lost, max_hold)

    async def available(self) -> int:
        """Permits not held by a live lease, under this object's limit (read-only)."""
        return max(0, self._limit - len((await self.info()).holders))

    async def info(self) -> PrimitiveInfo:
        """Live leases with their TTL left, the waiters and the stored limit, read-only."""
        return await run(self._client, self._scripts.info(self.name, self._limit))

    def __repr__(self) -> str:
        fair = " fair" if self._fair else ""
        return f"<AsyncRedisSemaphore {self.name!r} limit={self._limit} ttl={self.ttl}{fair}>"

    # -- one round trip each ----------------------------------------------------------

    async def _attempt(
        self, token: str, owner: str, ttl_ms: int, wait: bool
    ) -> tuple[int, int, int, int]:
        operation = self._scripts.attempt(token, owner, ttl_ms, wait)
        return (await run(self._client, operation, batched=True))[0]

    async def _release_lease(self, token: str, deadline: float) -> bool:
        return await self._release_token(token)

    async def _release_token(self, token: str) -> bool:
        # Waiters of this loop that the release grants are named in its reply and
        # woken as it is read (see AsyncNotifier.hand_over): no message round for
        # them. A release may be sent twice (a re-send answers as the first, grants
        # included: a release cancelled in flight and sent again in the background
        # still hands its grants over).
        notifier = AsyncNotifier.current(self._client)
        if notifier is None:
            return await run(self._client, self._scripts.release(token))
        operation = self._scripts.release_granting(token, notifier.tag)
        released, grants = await run(self._client, operation, batched=True)
        if grants:
            notifier.hand_over(f"{self._scripts.channel}:{notifier.tag}", grants)
        return released

    # -- the renewer's side (renewal.Renewable) ---------------------------------------

    _renew_script = RENEW

    @property
    def _renew_keys(self) -> tuple[str, str]:
        return (self._keys.holders, self._keys.leases)
