"""``AsyncRedisRateLimiter``: the rate limiter of :class:`~celery_redislock.core.
ratelimit.RedisRateLimiter` for ``redis.asyncio`` clients.

Same operations (:mod:`~celery_redislock.core.ratelimit_scripts`: scripts, keys,
arguments, replies and the waiting decision); only the calls and the sleeps are
awaited. Sync and async clients of one name share one limit.
"""

from __future__ import annotations

import asyncio

from ..core.clients import AsyncRedisClient
from ..core.keys import DEFAULT_PREFIX
from ..core.ratelimit_rates import Rate
from ..core.ratelimit_scripts import (
    DEFAULT_SLOTS,
    Admission,
    RateLimitInfo,
    RateLimitScripts,
    describe,
    state_key,
    stored_rates,
)
from ..core.validate import acquire_deadline, check_async_client
from .calls import run

__all__ = ["AsyncRedisRateLimiter"]


class AsyncRedisRateLimiter:
    """A rate limit shared by every process using ``client``'s Redis and ``name``;
    the arguments and the guarantee of :class:`~celery_redislock.core.ratelimit.
    RedisRateLimiter` (``client`` a ``redis.asyncio.Redis`` or ``RedisCluster``)."""

    def __init__(
        self,
        client: AsyncRedisClient,
        name: str,
        *,
        rate: str | list[str] | tuple[str, ...],
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
        start_spent: bool = True,
    ) -> None:
        self._client = check_async_client(client)
        self._scripts = RateLimitScripts(self._client, name, rate, prefix, slots, start_spent)

    @classmethod
    async def attach(
        cls,
        client: AsyncRedisClient,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
    ) -> AsyncRedisRateLimiter | None:
        """As :meth:`RedisRateLimiter.attach`."""
        checked = check_async_client(client)
        value = await checked.hget(state_key(checked, name, prefix), "rates")
        rates = stored_rates(value)
        return None if rates is None else cls(client, name, rate=rates, prefix=prefix, slots=slots)

    @property
    def name(self) -> str:
        """The limiter's name."""
        return self._scripts.name

    @property
    def rates(self) -> tuple[Rate, ...]:
        """The configured rates, parsed."""
        return self._scripts.rates

    @property
    def last_admission(self) -> Admission | None:
        """The last admission by this limiter in this asyncio task, or None."""
        return self._scripts.last_admission

    async def acquire(
        self, cost: int = 1, *, blocking: bool = True, timeout: float | None = None
    ) -> bool:
        """As :meth:`RedisRateLimiter.acquire`, sleeping with ``asyncio.sleep``."""
        deadline = acquire_deadline(blocking, timeout)
        while True:
            verdict = await run(self._client, self._scripts.attempt(cost, True))
            if verdict.admitted:
                return True
            pause = self._scripts.pause(verdict, deadline)
            if pause is None:
                return False
            await asyncio.sleep(pause)

    async def retry_after(self, cost: int = 1) -> float:
        """Seconds until ``cost`` units would be admitted (0.0: now); charges nothing."""
        return (await run(self._client, self._scripts.attempt(cost, False))).wait

    async def penalize(self, seconds: float) -> float:
        """As :meth:`RedisRateLimiter.penalize`."""
        return await run(self._client, self._scripts.penalize(seconds))

    async def adjust(self, delta: int, admission: Admission | None = None) -> int:
        """As :meth:`RedisRateLimiter.adjust` (default: this task's last admission)."""
        return await run(self._client, self._scripts.adjust(delta, admission))

    async def reset(self) -> None:
        """As :meth:`RedisRateLimiter.reset`."""
        await run(self._client, self._scripts.reset())

    async def override(self, rate: str | list[str] | tuple[str, ...], ttl: float) -> None:
        """As :meth:`RedisRateLimiter.override`."""
        await run(self._client, self._scripts.override(rate, ttl))

    async def clear_override(self) -> None:
        """As :meth:`RedisRateLimiter.clear_override`."""
        await run(self._client, self._scripts.clear_override())

    async def info(self, cost: int = 1) -> RateLimitInfo:
        """As :meth:`RedisRateLimiter.info`."""
        return await run(self._client, self._scripts.info(cost))

    def __repr__(self) -> str:
        return f"<AsyncRedisRateLimiter {self.name!r} {describe(self.rates)}>"
