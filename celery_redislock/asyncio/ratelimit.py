"""``AsyncRedisRateLimiter``: the rate limiter of :class:`~celery_redislock.core.
ratelimit.RedisRateLimiter` for ``redis.asyncio`` clients.

Same scripts, keys, arguments and reply reading (:mod:`~celery_redislock.core.
ratelimit_scripts`); only the calls and the sleeps are awaited. Sync and async clients
of one name share one limit.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..core.keys import DEFAULT_PREFIX
from ..core.ratelimit_rates import Rate
from ..core.ratelimit_scripts import (
    ACQUIRE,
    ADJUST,
    DEFAULT_SLOTS,
    INFO,
    OVERRIDE,
    PENALIZE,
    RESET,
    Admission,
    RateLimitInfo,
    RateLimitScripts,
    Verdict,
    describe,
    penalty_end,
    state_key,
    stored_rates,
)
from ..core.validate import acquire_deadline, check_async_client
from .calls import call

__all__ = ["AsyncRedisRateLimiter"]


class AsyncRedisRateLimiter:
    """A rate limit shared by every process using ``client``'s Redis and ``name``;
    the arguments and the guarantee of :class:`~celery_redislock.core.ratelimit.
    RedisRateLimiter` (``client`` a ``redis.asyncio.Redis`` or ``RedisCluster``)."""

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        rate: str | list[str] | tuple[str, ...],
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
        start_spent: bool = True,
    ) -> None:
        self._client = check_async_client(client)
        self._scripts = RateLimitScripts(client, name, rate, prefix, slots, start_spent)

    @classmethod
    async def attach(
        cls, client: Any, name: str, *, prefix: str = DEFAULT_PREFIX, slots: int = DEFAULT_SLOTS
    ) -> AsyncRedisRateLimiter | None:
        """The limiter ``name`` with the rates its last admitting caller configured (as
        stored in Redis), for tools that know only its name (the CLI); None when Redis
        holds no state for it."""
        value = await check_async_client(client).hget(state_key(client, name, prefix), "rates")
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

    async def _try(self, cost: int, charge: bool) -> Verdict:
        args = self._scripts.acquire_args(cost, charge)
        reply = await call(ACQUIRE, self._client, self._scripts.keys, args)
        return self._scripts.verdict(reply, args)

    async def acquire(
        self, cost: int = 1, *, blocking: bool = True, timeout: float | None = None
    ) -> bool:
        """As :meth:`RedisRateLimiter.acquire`, sleeping with ``asyncio.sleep``."""
        deadline = acquire_deadline(blocking, timeout)
        while True:
            verdict = await self._try(cost, True)
            if verdict.admitted:
                return True
            if deadline is None or time.monotonic() + verdict.wait > deadline:
                return False
            await asyncio.sleep(verdict.wait)

    async def retry_after(self, cost: int = 1) -> float:
        """Seconds until ``cost`` units would be admitted (0.0: now); charges nothing."""
        return (await self._try(cost, False)).wait

    async def penalize(self, seconds: float) -> float:
        """As :meth:`RedisRateLimiter.penalize`."""
        args = self._scripts.penalize_args(seconds)
        return penalty_end(await call(PENALIZE, self._client, [self._scripts.state], args))

    async def adjust(self, delta: int, admission: Admission | None = None) -> int:
        """As :meth:`RedisRateLimiter.adjust` (default: this task's last admission)."""
        keys, args = self._scripts.adjust_call(delta, admission)
        return int(await call(ADJUST, self._client, keys, args))

    async def reset(self) -> None:
        """As :meth:`RedisRateLimiter.reset`."""
        await call(RESET, self._client, self._scripts.keys, self._scripts.nonce_args())

    async def override(self, rate: str | list[str] | tuple[str, ...], ttl: float) -> None:
        """As :meth:`RedisRateLimiter.override`."""
        args = self._scripts.override_args(rate, ttl)
        await call(OVERRIDE, self._client, [self._scripts.state], args)

    async def clear_override(self) -> None:
        """As :meth:`RedisRateLimiter.clear_override`."""
        args = self._scripts.clear_override_args()
        await call(OVERRIDE, self._client, [self._scripts.state], args)

    async def info(self, cost: int = 1) -> RateLimitInfo:
        """As :meth:`RedisRateLimiter.info`."""
        args = self._scripts.info_args(cost)
        return self._scripts.info(await call(INFO, self._client, self._scripts.keys, args))

    def __repr__(self) -> str:
        return f"<AsyncRedisRateLimiter {self.name!r} {describe(self.rates)}>"
