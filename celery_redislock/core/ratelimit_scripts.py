"""The rate limiter's Lua scripts (``lua/ratelimit_*.lua``) and its operations on them;
no I/O.

:class:`RateLimitScripts` holds one limiter's keys and offers its operations
(generators of script calls, see :mod:`.operations`): ``attempt``, ``adjust``,
``penalize``, ``override``, ``clear_override``, ``reset``, ``info``, and the waiting
decision ``pause``. The sync :class:`~.ratelimit.RedisRateLimiter` and the async
``AsyncRedisRateLimiter`` only drive them (a call or an await, ``time.sleep`` or
``asyncio.sleep``; issue #25).

Loss detection: every reply tells until when (server µs) the limiter's state is kept
at least; the next call of any limiter of that client and name sends it back as
``seen``, so a script finding the state missing before then knows it was lost
(Redis restarted empty or flushed) and, with ``start_spent``, charges every rate as
spent for one period. That memory is kept per client object (:func:`remember`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from redis.typing import EncodableT, KeyT

from ..errors import ConfigurationError
from .clients import AnyRedisClient
from .keys import KeySpace
from .lock_scripts import RELEASE_MEMORY_MS
from .operations import Call, Operation
from .ratelimit_rates import MAX_COST, Rate, check_cost, from_wire, parse_rates, wire
from .scripts import LuaScript, ScriptReply, as_text, key_encoder, reply_array, reply_int
from .validate import MAX_SECONDS, check_bool, check_positive_int, ttl_to_ms

__all__ = [
    "ACQUIRE",
    "ADJUST",
    "INFO",
    "KIND",
    "LATE",
    "OVERRIDE",
    "PENALIZE",
    "RESET",
    "Admission",
    "RateLimitInfo",
    "RateLimitScripts",
    "RateUsage",
    "Verdict",
    "describe",
    "state_key",
    "stored_rates",
]

log = logging.getLogger(__name__)

KIND = "ratelimit"
"""The limiter's key kind: ``<prefix>:ratelimit:{name}:log`` and ``...:state``."""

ACQUIRE = LuaScript("ratelimit_acquire.lua")
ADJUST = LuaScript("ratelimit_adjust.lua")
PENALIZE = LuaScript("ratelimit_penalize.lua")
OVERRIDE = LuaScript("ratelimit_override.lua")
RESET = LuaScript("ratelimit_reset.lua")
INFO = LuaScript("ratelimit_info.lua")
LATE = LuaScript("ratelimit_late.lua", {"RELEASE_MEMORY_MS": RELEASE_MEMORY_MS})

DEFAULT_SLOTS = 1000
"""Slots per period an admission is recorded in (see lua/lib_ratelimit.lua): memory at
most ``slots + 1`` log members per period, and under saturation at least
``slots / (slots + 1)`` of the limit per period; never more than the limit."""

MAX_SLOTS = 1_000_000

_US = 1_000_000


@dataclass(frozen=True)
class Admission:
    """One admitted and charged call: what :meth:`adjust` corrects.

    ``limiter`` is the limiter's key base, ``id`` its charged slots, ``cost`` the
    units charged, ``at`` the server time of the admission (seconds since the epoch).
    """

    limiter: str
    id: str
    cost: int
    at: float


@dataclass(frozen=True)
class Verdict:
    """An acquire's (or retry_after's) answer: ``admitted`` now, else ``wait``
    seconds until the server's earliest admission time for the cost."""

    admitted: bool
    wait: float
    admission: Admission | None
    lost: bool


@dataclass(frozen=True)
class RateUsage:
    """One rate that admits now: ``limit`` per ``period`` seconds, ``used`` cost units
    charged within the last period (slots not yet expired)."""

    limit: int
    period: float
    used: int


@dataclass(frozen=True)
class RateLimitInfo:
    """A limiter's state at one instant of the server's clock.

    ``rates``: the configured rates (as the limiter's last admitting caller configured
    them: another process may run another configuration); ``active``: the rates that admit now (the
    override's while one is set); ``wait``: seconds until a cost-1 call is admitted
    (0.0: now); ``penalty_left``: seconds left of a penalty (0.0: none);
    ``override`` and ``override_left``: the override as written and its seconds left
    (None and 0.0: none); ``server_time``: the server's clock (seconds since the epoch).
    """

    name: str
    rates: tuple[str, ...]
    active: tuple[RateUsage, ...]
    wait: float
    penalty_left: float
    override: str | None
    override_left: float
    server_time: float


# The last admission per context (thread, asyncio task): adjust()'s default.
_LAST: ContextVar[Admission | None] = ContextVar("celery_redislock_admission", default=None)

# Per client object: limiter key base -> the `keep` (server µs) its last reply told.
_SEEN: weakref.WeakKeyDictionary[AnyRedisClient, dict[str, int]] = weakref.WeakKeyDictionary()
_SEEN_GUARD = threading.Lock()


def remember(client: AnyRedisClient, base: str, keep: int) -> None:
    """Note that ``client``'s server keeps ``base``'s state until ``keep`` (µs)."""
    with _SEEN_GUARD:
        seen = _SEEN.setdefault(client, {})
        if keep > seen.get(base, 0):
            seen[base] = keep


def seen(client: AnyRedisClient, base: str) -> int:
    """The ``keep`` last told to ``client`` for ``base`` (0: never)."""
    with _SEEN_GUARD:
        return _SEEN.get(client, {}).get(base, 0)


class RateLimitScripts:
    """The keys and arguments of one limiter's script calls, and their replies read."""

    def __init__(
        self,
        client: AnyRedisClient,
        name: str,
        rate: object,
        prefix: str,
        slots: object,
        start_spent: object,
    ) -> None:
        self.rates: tuple[Rate, ...] = parse_rates(rate, "rate")
        self.slots = check_positive_int(slots, "slots")
        if self.slots > MAX_SLOTS:
            raise ConfigurationError(f"slots must be at most {MAX_SLOTS}, got {slots!r}")
        self.start_spent = check_bool(start_spent, "start_spent")
        self.space = KeySpace.build(prefix, KIND, name)
        self.name = name
        self.client = client
        encode = key_encoder(client)
        self.base = self.space.base
        self.log = encode(self.space.key("log"))
        self.state = encode(self.space.key("state"))
        self.keys: list[KeyT] = [self.log, self.state]
        self.spec = wire(self.rates)
        self.smallest = min(rate.limit for rate in self.rates)

    # -- for other scripts that include lib_ratelimit.lua -----------------------

    def lib_args(self) -> list[EncodableT]:
        """``[spec, slots, seen, spent]``: what ``rl_prepare`` takes besides the keys
        (:attr:`keys`: log, state) and ``now``, for a script of another module that
        admits by this limiter (the Celery side's parking). Its reply should carry
        rl_prepare's ``keep`` back to :meth:`kept`."""
        return [self.spec, self.slots, seen(self.client, self.base), int(self.start_spent)]

    def kept(self, keep: int, lost: bool = False) -> None:
        """Note rl_prepare's ``keep`` (and ``lost``) from another module's script (see
        :meth:`lib_args`)."""
        self._note(keep, lost)

    def _note(self, keep: ScriptReply, lost: ScriptReply) -> None:
        remember(self.client, self.base, reply_int(keep))
        if lost:  # never silent: the loss is reported once, by the call that found it
            log.warning(
                "rate limiter %r: its state in Redis was lost (restarted empty or flushed); "
                "charged as spent for one period%s",
                self.name,
                "" if self.start_spent else " (start_spent=False: not charged)",
            )

    def late_charge(self, cost: int, margin_us: int, done: KeyT, owner: str) -> Operation[bool]:
        """A run that started later than its take's charge covers: that charge (noted
        in ``done`` for ``owner`` by its take) moves to the server's now plus
        ``margin_us``; without the note, ``cost`` (checked by the caller) is charged
        once more, whatever the limiter holds (see ``ratelimit_late.lua``). True when
        the charge was moved."""
        args: list[EncodableT] = [
            secrets.token_hex(4),
            self.spec,
            cost,
            self.slots,
            seen(self.client, self.base),
            int(self.start_spent),
            margin_us,
            owner,
        ]
        keep, lost, moved = reply_array((yield Call(LATE, [*self.keys, done], args)))
        self._note(keep, lost)
        return bool(moved)

    # -- acquire / retry_after -------------------------------------------------

    def attempt(self, cost: object, charge: bool) -> Operation[Verdict]:
        """One admission attempt for ``cost`` (checked): admitted and charged, or when
        it will be; ``charge`` False only tells (retry_after). An admission becomes
        this context's last (see :attr:`last_admission`)."""
        units = check_cost(cost)
        if units > self.smallest:
            raise ConfigurationError(
                f"cost must be at most the smallest limit of {self.name!r} "
                f"({self.smallest}), got {cost!r}"
            )
        args: list[EncodableT] = [
            secrets.token_hex(4),
            self.spec,
            units,
            self.slots,
            seen(self.client, self.base),
            int(self.start_spent),
            int(charge),
        ]
        code, now, at, id_, keep, lost = reply_array((yield Call(ACQUIRE, self.keys, args)))
        self._note(keep, lost)
        if code == 2:  # an override lowered a limit below this cost
            raise ConfigurationError(
                f"cost must be at most every limit of {self.name!r} now "
                f"({reply_int(at)}), got {cost!r}"
            )
        if code == 1:
            admission = Admission(self.base, as_text(id_), units, reply_int(now) / _US)
            _LAST.set(admission)
            return Verdict(True, 0.0, admission, bool(lost))
        return Verdict(False, max(0, reply_int(at) - reply_int(now)) / _US, None, bool(lost))

    @staticmethod
    def pause(verdict: Verdict, deadline: float | None) -> float | None:
        """After a refused attempt: the seconds to sleep before the next (until the
        server's admission time), or None to give up (``deadline``, a
        ``time.monotonic()`` instant from ``acquire_deadline``: None tries once, and
        an admission time past it is not waited for)."""
        if deadline is None or time.monotonic() + verdict.wait > deadline:
            return None
        return verdict.wait

    @property
    def last_admission(self) -> Admission | None:
        """This context's (thread's, asyncio task's) last admission by this limiter."""
        last = _LAST.get()
        return last if last is not None and last.limiter == self.base else None

    # -- adjust, penalize, override, reset, info -------------------------------

    def adjust_call(self, delta: object, admission: Admission | None) -> Call:
        """ADJUST's call: ``delta`` units for ``admission`` (None: this context's last
        admission by this limiter)."""
        if isinstance(delta, bool) or not isinstance(delta, int) or delta == 0:
            raise ConfigurationError(f"delta must be a non-zero int, got {delta!r}")
        if abs(delta) > MAX_COST:
            raise ConfigurationError(f"delta must be at most {MAX_COST} in size, got {delta!r}")
        target = self.last_admission if admission is None else admission
        if target is None:
            raise ConfigurationError(
                f"admission must be given: no admission by {self.name!r} in this context"
            )
        if not isinstance(target, Admission) or target.limiter != self.base:
            raise ConfigurationError(
                f"admission must be an Admission of {self.name!r}, got {admission!r}"
            )
        nonce = secrets.token_hex(8)
        encode = key_encoder(self.client)
        adjusted = self.space.key(f"adjusted:{round(target.at * _US)}:{target.id}")
        keys: list[KeyT] = [*self.keys, encode(self.space.done(nonce)), encode(adjusted)]
        return Call(ADJUST, keys, [nonce, target.id, target.cost, delta, self.slots])

    def adjust(self, delta: object, admission: Admission | None) -> Operation[int]:
        """Correct ``admission`` by ``delta`` units; the units moved."""
        return reply_int((yield self.adjust_call(delta, admission)))

    def penalize(self, seconds: object) -> Operation[float]:
        """Admit nobody before the server's now + ``seconds`` (>= 0); the server time
        (seconds since the epoch) the penalty ends."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ConfigurationError(f"seconds must be a number >= 0, got {seconds!r}")
        if not 0 <= seconds <= MAX_SECONDS:
            raise ConfigurationError(f"seconds must be from 0 to {MAX_SECONDS}, got {seconds!r}")
        args: list[EncodableT] = [secrets.token_hex(4), round(seconds * _US)]
        reply = reply_array((yield Call(PENALIZE, [self.state], args)))
        return reply_int(reply[1]) / _US

    def override(self, rate: object, ttl: object) -> Operation[None]:
        """Admit by ``rate`` instead of the configured rates for ``ttl`` seconds."""
        rates = parse_rates(rate, "rate")
        ms = ttl_to_ms(ttl, "ttl")
        args: list[EncodableT] = [secrets.token_hex(4), wire(rates), describe(rates), ms * 1000]
        yield Call(OVERRIDE, [self.state], args)

    def clear_override(self) -> Operation[None]:
        """End an override now."""
        yield Call(OVERRIDE, [self.state], [secrets.token_hex(4), "", "", 0])

    def reset(self) -> Operation[None]:
        """Forget every charge and the penalty."""
        yield Call(RESET, self.keys, [secrets.token_hex(4)])

    def info(self, cost: object = 1) -> Operation[RateLimitInfo]:
        """The limiter's state now, the next admission computed for ``cost``."""
        args: list[EncodableT] = [
            secrets.token_hex(4),
            self.spec,
            check_cost(cost),
            self.slots,
            seen(self.client, self.base),
            int(self.start_spent),
        ]
        reply = reply_array((yield Call(INFO, self.keys, args)))
        server_now, at, penalty, text, ends, listed, keep, spec, lost = reply
        self._note(keep, lost)
        now, rows = reply_int(server_now), reply_array(listed)
        active = tuple(
            RateUsage(reply_int(rows[i]), reply_int(rows[i + 1]) / _US, reply_int(rows[i + 2]))
            for i in range(0, len(rows), 3)
        )
        override = as_text(text) or None
        return RateLimitInfo(
            name=self.name,
            rates=tuple(rate.text for rate in from_wire(as_text(spec))),
            active=active,
            wait=max(0, reply_int(at) - now) / _US if reply_int(at) >= 0 else float("inf"),
            penalty_left=max(0, reply_int(penalty) - now) / _US,
            override=override,
            override_left=max(0, reply_int(ends) - now) / _US if override else 0.0,
            server_time=now / _US,
        )


def state_key(client: AnyRedisClient, name: str, prefix: str) -> bytes:
    """The key of ``name``'s state (where the scripts store its configured rates)."""
    return key_encoder(client)(KeySpace.build(prefix, KIND, name).key("state"))


def stored_rates(value: bytes | str | None) -> list[str] | None:
    """The rate strings of a state's stored ``rates`` field (None: none stored)."""
    rates = from_wire(as_text(value)) if value else ()
    return [rate.text for rate in rates] or None


def describe(rates: Sequence[Rate]) -> str:
    """``"10/s, 500/m"``: rates as their caller wrote them."""
    return ", ".join(rate.text for rate in rates)
