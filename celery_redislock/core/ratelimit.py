"""RedisRateLimiter: N admissions per period across every process, by the server's clock.

``rate`` is ``"N/period"`` (``"10/s"``, ``"1000/15m"``) or a list of them, all of
which must admit a call; they are checked and charged in one script, all or nothing.
Each call costs ``cost`` units (1 by default; e.g. an LLM call's tokens).

**Guarantee.** Never more than N units admitted in any window of one period (a
half-open interval of that length), whatever the number of processes and their
clocks: the scripts decide on Redis's clock alone (``TIME``), and keep a sliding log
of the admissions (lua/lib_ratelimit.lua). To bound its memory the log records each
admission at the end of its *slot* (``period / slots`` wide, ``slots`` 1000 by
default), so an admission counts slightly longer than a period, never shorter: the
window is never exceeded, and under saturation at least ``slots / (slots + 1)`` of N
is admitted per period (99.9 % by default, less the callers' wake-up latency). The
log holds at most ``slots + 1`` members per period whatever N is (a "90000/m" token
limit costs as little as a "10/s" one); fewer ``slots`` is cheaper in memory and
script time and admits a little less under saturation (``slots=10``: >= 90 %).
A fresh limiter admits a burst of N at once (then nothing until the window moves):
the strict window, not a smoothed spacing.

**Waiting.** A refused ``acquire`` sleeps until the admission time the server computed
for its cost (the earliest instant every rate admits it and no penalty holds), then
tries again (another caller may have taken the room meanwhile). No polling loop.

**Lost state.** A limiter whose keys vanished (Redis restarted empty, flushed) starts
as spent for one period, so no fresh burst passes, when the call that finds the
loss comes from a client that saw the state before (see
:mod:`.ratelimit_scripts`); ``start_spent=False`` opts out. A penalty and an override
are lost with the state.

**Re-sends.** redis-py re-sends a call whose reply was lost: a re-sent acquire may
charge twice (the safe side: it never over-admits); ``adjust`` is answered once per
call.
"""

from __future__ import annotations

import time

from .keys import DEFAULT_PREFIX, decode_name
from .operations import run
from .ratelimit_rates import Rate
from .ratelimit_scripts import (
    DEFAULT_SLOTS,
    KIND,
    Admission,
    RateLimitInfo,
    RateLimitScripts,
    describe,
    state_key,
    stored_rates,
)
from .scripts import RedisClient, as_text
from .validate import acquire_deadline, check_client, check_name

__all__ = ["RedisRateLimiter", "limiter_names"]


class RedisRateLimiter:
    """A rate limit shared by every process using ``client``'s Redis and ``name``.

    ``rate``: ``"N/period"`` or a list of them (see the module). ``prefix``: the key
    prefix (keys ``<prefix>:ratelimit:{name}:log`` and ``:state``, one hash tag).
    ``slots``: slots per period (memory against saturation throughput; see the
    module). ``start_spent``: after the state was lost, start as spent for a period.
    Bad arguments raise :class:`~celery_redislock.errors.ConfigurationError`.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        rate: str | list[str] | tuple[str, ...],
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
        start_spent: bool = True,
    ) -> None:
        self._client = check_client(client)
        self._scripts = RateLimitScripts(client, name, rate, prefix, slots, start_spent)

    @classmethod
    def attach(
        cls,
        client: RedisClient,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        slots: int = DEFAULT_SLOTS,
    ) -> RedisRateLimiter | None:
        """The limiter ``name`` with the rates its last admitting caller configured (as
        stored in Redis), for tools that know only its name (the CLI); None when Redis
        holds no state for it."""
        value = check_client(client).hget(state_key(client, name, prefix), "rates")
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
        """The last admission by this limiter in this thread (or asyncio task), or None:
        what :meth:`adjust` corrects by default."""
        return self._scripts.last_admission

    def acquire(
        self, cost: int = 1, *, blocking: bool = True, timeout: float | None = None
    ) -> bool:
        """Admit and charge ``cost`` units: True once admitted; False when not admitted
        within ``timeout`` seconds (at once with ``blocking=False`` or ``timeout=0``,
        and at once when the server's earliest admission time is past the timeout).
        A blocked caller sleeps until that admission time (see the module)."""
        deadline = acquire_deadline(blocking, timeout)
        while True:
            verdict = run(self._client, self._scripts.attempt(cost, True))
            if verdict.admitted:
                return True
            pause = self._scripts.pause(verdict, deadline)
            if pause is None:
                return False
            time.sleep(pause)

    def retry_after(self, cost: int = 1) -> float:
        """Seconds until ``cost`` units would be admitted (0.0: now); charges nothing."""
        return run(self._client, self._scripts.attempt(cost, False)).wait

    def penalize(self, seconds: float) -> float:
        """Admit nobody, in any process, before the server's now + ``seconds`` (an
        API's 429 ``Retry-After``). A longer penalty already set stays. Returns the
        server time (seconds since the epoch) the penalty ends."""
        return run(self._client, self._scripts.penalize(seconds))

    def adjust(self, delta: int, admission: Admission | None = None) -> int:
        """Correct an admission's charge by ``delta`` units: > 0 charges more (e.g. the
        real token count was higher), < 0 refunds (never more than it was charged:
        its cost and extra charges less earlier refunds; nothing once its window
        passed). ``admission``: default this thread's (task's) last admission
        by this limiter (:attr:`last_admission`). Returns the units moved."""
        return run(self._client, self._scripts.adjust(delta, admission))

    def reset(self) -> None:
        """Forget every charge and the penalty: the full limit is admitted at once.
        What was configured stays: an override (an operator's live rate; end it with
        :meth:`clear_override`) and the stored rates (:meth:`attach` still finds the
        limiter)."""
        run(self._client, self._scripts.reset())

    def override(self, rate: str | list[str] | tuple[str, ...], ttl: float) -> None:
        """Admit by ``rate`` instead of the configured rates, in every process, for
        ``ttl`` seconds (kept in Redis; the configured periods go on counting, so they
        hold again when it ends)."""
        run(self._client, self._scripts.override(rate, ttl))

    def clear_override(self) -> None:
        """End an override now."""
        run(self._client, self._scripts.clear_override())

    def info(self, cost: int = 1) -> RateLimitInfo:
        """The limiter's state now: rates, what each counts, when ``cost`` is admitted
        next, penalty and override (see :class:`RateLimitInfo`)."""
        return run(self._client, self._scripts.info(cost))

    def __repr__(self) -> str:
        return f"<RedisRateLimiter {self.name!r} {describe(self.rates)}>"


def limiter_names(client: RedisClient, *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The names of the limiters Redis holds state for under ``prefix``, sorted (by
    ``SCAN``: every node of a cluster client); each opens with
    :meth:`RedisRateLimiter.attach`."""
    check_client(client)
    check_name(prefix, "prefix")
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    head, tail = f"{prefix}:{KIND}:{{", "}:state"
    names = set()
    for raw in client.scan_iter(match=f"{escaped}:{KIND}:{{*}}:state", count=1000):
        key = as_text(raw)
        if key.startswith(head) and key.endswith(tail):
            encoded = key[len(head) : -len(tail)]
            if encoded and "{" not in encoded and "}" not in encoded:
                names.add(decode_name(encoded))
    return sorted(names)
