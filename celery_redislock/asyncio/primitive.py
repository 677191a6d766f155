"""What ``AsyncRedisLock`` and ``AsyncRedisSemaphore`` share: settings (the sync
classes' own, :class:`~celery_redislock.core.primitive.PrimitiveBase`), ``async
with``, lease creation and renewal, and giving up a token when an acquire is
cancelled or fails.

Cancellation: an acquire interrupted at any ``await`` (a ``CancelledError``, an
``asyncio.timeout``, an error) gives its token up before the exception goes on: it
leaves the wait queue and releases any lease granted to it -- by its own request in
flight or by a release that handed it over meanwhile. That clean-up runs in a task
of its own, shielded, so a second cancellation cannot stop it; and, because a
request cancelled in flight is dropped with its connection (redis-py's rule) and
may still reach Redis after the clean-up, the clean-up runs once more a moment
later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, cast

from redis.exceptions import RedisError

from ..core.clients import AsyncRedisClient
from ..core.operations import PrimitiveOperations
from ..core.primitive import PrimitiveBase, check_owner
from ..core.replicas import DEFAULT_REPLICA_TIMEOUT
from ..core.scripts import reply_deadline
from ..core.validate import check_async_client, check_bool
from ..errors import ConfigurationError
from .calls import run
from .lease import AsyncLease, AsyncOnLost
from .renewal import keep_alive_async

__all__ = ["CLEANUP_GRACE", "LATE_CLEANUP", "AsyncPrimitive", "cancel_check"]

log = logging.getLogger(__name__)

CLEANUP_GRACE = 0.5
"""Longest a clean-up pass waits for Redis (see :func:`~celery_redislock.core.scripts.
reply_deadline`)."""

LATE_CLEANUP = 0.2
"""Seconds after a cancelled acquire's clean-up when it is run once more (a request
cancelled in flight may still reach Redis after the first one)."""

_background: set[asyncio.Task[None]] = set()  # clean-ups in flight (kept referenced)
_CLIENT_CLASSES: set[type] = set()  # client classes check_async_client accepted


def cancel_check() -> Callable[[], None]:
    """A check that raises ``CancelledError`` once the running task was asked to
    cancel after this call, even if the request was swallowed on its way: Python
    3.11's ``asyncio.wait_for`` (which redis-py awaits inside a command) returns the
    inner result when the cancel arrives as that result does (fixed in 3.12), so a
    cancelled acquire could otherwise run on and take a lease nobody waits for.
    ``Task.cancelling()`` still counts the request."""
    if sys.version_info < (3, 11):  # for mypy's 3.10: this package refuses to import there
        raise RuntimeError("celery_redislock.asyncio needs Python 3.11+")
    task = asyncio.current_task()
    assert task is not None  # called from an acquire, in a task
    base = task.cancelling()

    def check() -> None:
        if task.cancelling() > base:
            raise asyncio.CancelledError

    return check


class AsyncPrimitive(PrimitiveBase):
    """Base of the async lock and semaphore (see the module docs)."""

    _scripts: PrimitiveOperations
    _client: AsyncRedisClient

    def __init__(
        self,
        client: AsyncRedisClient,
        name: str,
        *,
        ttl: float,
        prefix: str,
        renew: bool,
        max_hold: float | None,
        min_replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
        wait_aof: bool = False,
    ) -> None:
        super().__init__(client, name, ttl=ttl, prefix=prefix, renew=renew, max_hold=max_hold)
        if min_replicas or wait_aof:
            raise ConfigurationError(
                "min_replicas/wait_aof are not supported by celery_redislock.asyncio yet, "
                f"got min_replicas={min_replicas!r}, wait_aof={wait_aof!r}"
            )
        del replica_timeout  # accepted for the sync classes' signature
        self._held: dict[asyncio.Task[object], list[AsyncLease]] = {}

    @staticmethod
    def _checked_client(client: object) -> AsyncRedisClient:
        # Checked once per class: a lock is built per call (`async with
        # AsyncRedisLock(client, f"user:{uid}")`), and isinstance against the
        # client classes costs a quarter of building one.
        if client.__class__ not in _CLIENT_CLASSES:
            _CLIENT_CLASSES.add(check_async_client(client).__class__)
        return cast("AsyncRedisClient", client)  # its class was checked (above)

    @property
    def client(self) -> AsyncRedisClient:
        """The ``redis.asyncio`` client this talks to."""
        return self._client

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
        """Take a lease (see the subclass)."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def hold(
        self,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: AsyncOnLost | None = None,
        max_hold: float | None = None,
    ) -> AsyncIterator[AsyncLease]:
        """``async with lock.hold(timeout=5) as lease:`` -- acquire with options,
        release on exit; as the sync ``hold()``: raises
        :class:`~celery_redislock.errors.LockTimeout` when not granted (the block never
        runs without the lease), and :class:`~celery_redislock.errors.LockNotOwned` on
        leaving a block whose lease was lost."""
        check_bool(blocking, "blocking")
        lease, holder = await self._hold_attempt(
            blocking, timeout, owner, ttl, renew, on_lost, max_hold
        )
        if lease is None:
            raise self._not_granted(blocking, timeout, holder)
        async with lease:
            yield lease

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
        """``hold``'s acquire: the lease (or None) and the holder's owner id if known."""
        lease = await self.acquire(
            blocking, timeout, owner, ttl=ttl, renew=renew, on_lost=on_lost, max_hold=max_hold
        )
        return lease, None

    async def __aenter__(self) -> AsyncLease:
        lease = await self.acquire()
        assert lease is not None  # a blocking acquire without timeout returns a lease
        task = asyncio.current_task()
        assert task is not None
        self._held.setdefault(task, []).append(lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        stack = self._held[task]
        lease = stack.pop()
        if not stack:
            del self._held[task]
        await lease.__aexit__(exc_type, exc, tb)

    # -- for the subclasses -----------------------------------------------------------

    def _new_lease(
        self,
        token: str,
        fence: int,
        ttl_ms: int,
        owner: str | None,
        sent_at: float,
        renew: bool | None,
        on_lost: AsyncOnLost | None,
        max_hold: float | None,
    ) -> AsyncLease:
        """The lease for a grant, handed to the loop's renewer when renewal is on."""
        lease = AsyncLease(
            self, token, fence, ttl_ms / 1000.0, owner=owner, granted_at=sent_at, on_lost=on_lost
        )
        if self.renew if renew is None else renew:
            keep_alive_async(lease, self, max_hold)  # type: ignore[arg-type]
        return lease

    # -- the lease's requests and the waiter's leave: the operations of _scripts -------

    async def _release_token(self, token: str) -> bool:
        """Give up ``token`` in one round trip; False when it was no longer held."""
        return await run(self._client, self._scripts.release(token))

    async def _release_lease(self, token: str, deadline: float) -> bool:
        """A lease's release (``deadline``: its local one, for a holder that judges a
        re-sent release by it, as the lock does); by the token alone here."""
        return await run(self._client, self._scripts.release(token))

    async def _extend_token(self, token: str, ttl_ms: int, gen: int = 0) -> bool:
        """Set ``token``'s TTL in one round trip; False when it was no longer held."""
        return await run(self._client, self._scripts.extend(token, ttl_ms, gen))

    async def _held_token(self, token: str) -> int:
        """The ms ``token`` has left on the server, 0 when not live (read-only)."""
        return await run(self._client, self._scripts.held(token))

    async def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int:
        """Add ``ttl_ms`` to ``token``'s time left; the ms left after, 0 when not live."""
        return await run(self._client, self._scripts.extend_add(token, ttl_ms, nonce, gen))

    async def _leave(self, token: str) -> int:
        """Take waiter ``token`` out of the queue; the fence of a lease granted to it
        meanwhile, else 0."""
        return await run(self._client, self._scripts.leave(token))

    async def release_owner(self, owner: str) -> int:
        """Release every lease whose owner id is ``owner``; how many (as the sync
        ``release_owner``)."""
        return await run(self._client, self._scripts.release_owner(check_owner(owner)))

    async def force_release(self) -> int:
        """Release every lease, whoever holds it; how many (as the sync one)."""
        return await run(self._client, self._scripts.release_owner(""))

    async def _give_up(self, token: str) -> None:
        """Give ``token`` up after a failed or cancelled acquire: the first pass is
        awaited (shielded: a second cancel cannot stop it), the late one is not."""
        task = self._spawn(self._clean_up(token, late=True))
        with contextlib.suppress(BaseException):  # cancelled again: it runs on
            await asyncio.shield(task)

    async def _clean_up(self, token: str, late: bool) -> None:
        try:
            # Bounded: with Redis paused the waiter's heartbeat lapses and any lease
            # expires by itself; the cancelled acquire must not hang on it.
            with reply_deadline(time.monotonic() + CLEANUP_GRACE):
                await self._leave(token)
                await self._release_token(token)
        except (RedisError, OSError) as exc:
            # Unreachable: the waiter's heartbeat lapses and any lease expires.
            log.warning(
                "celery_redislock: giving up %s on %r failed: %r", self.kind, self.name, exc
            )
        if late:
            self._spawn(self._late_clean_up(token))

    async def _late_clean_up(self, token: str) -> None:
        await asyncio.sleep(LATE_CLEANUP)
        await self._clean_up(token, late=False)

    @staticmethod
    def _spawn(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        _background.add(task)
        task.add_done_callback(_background.discard)
        return task

    def _release_later(self, token: str) -> None:
        """Release ``token`` in the background (its release was cancelled in flight)."""
        self._spawn(self._clean_up(token, late=True))
