"""Rate strings (``"10/s"``, ``"1000/15m"``, a list of them), checked; no I/O.

A rate is ``"N/period"``: N admissions (cost units) per period, the period ``s``, ``m``,
``h`` or ``d`` optionally preceded by a count (``"5/10s"``: 5 per 10 seconds). A list
of rates must all admit a call. :func:`parse_rates` checks and parses them once, and
raises :class:`~celery_redislock.errors.ConfigurationError` naming the option and the
value; :func:`wire` gives the spec the scripts read (``lua/lib_ratelimit.lua``). Used by
the core limiter and by the Celery side's ``global_rate_limit`` option (issue #25).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from .validate import MAX_SECONDS

__all__ = ["MAX_COST", "Rate", "check_cost", "from_wire", "parse_rates", "wire"]

MAX_COST = 10**12
"""The largest limit or cost accepted: sums of costs stay exact in the scripts' numbers
(doubles, exact below 2^53) however many slots a period holds."""

_UNITS_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*", re.ASCII)
_FORM = "'N/period' (N >= 1; period s, m, h or d, optionally with a count: '5/10s')"


@dataclass(frozen=True)
class Rate:
    """``limit`` cost units per ``period_us`` microseconds; ``text`` as written."""

    limit: int
    period_us: int
    text: str

    @property
    def period(self) -> float:
        """The period in seconds."""
        return self.period_us / 1_000_000


def parse_rates(value: object, option: str = "rate") -> tuple[Rate, ...]:
    """The rates of ``value``: one rate string or a non-empty list (or tuple) of them.
    Anything else raises :class:`ConfigurationError` naming ``option`` and the value."""
    if isinstance(value, str):
        return (_parse_one(value, option),)
    if isinstance(value, (list, tuple)) and value:
        try:
            return tuple(_parse_one(item, option) for item in value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} (in {value!r})") from None
    raise ConfigurationError(
        f"{option} must be a rate {_FORM} or a non-empty list of them, got {value!r}"
    )


def _parse_one(text: object, option: str) -> Rate:
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigurationError(f"{option} must be a rate {_FORM}, got {text!r}")
    limit, count = int(match[1]), int(match[2] or 1)
    if not 1 <= limit <= MAX_COST:
        raise ConfigurationError(
            f"{option} must admit at least 1 and at most {MAX_COST} per period, got {text!r}"
        )
    period_us = count * _UNITS_US[match[3]]
    if count < 1 or period_us > MAX_SECONDS * 1_000_000:
        raise ConfigurationError(
            f"{option} must have a period of at least 1 unit and at most {MAX_SECONDS} "
            f"seconds, got {text!r}"
        )
    assert isinstance(text, str)
    return Rate(limit, period_us, text.strip())


def wire(rates: Sequence[Rate]) -> str:
    """The spec the scripts read: ``"L:P[,L:P...]"`` (limit, period in µs)."""
    return ",".join(f"{rate.limit}:{rate.period_us}" for rate in rates)


def from_wire(spec: str) -> tuple[Rate, ...]:
    """The rates of a spec :func:`wire` made (as the scripts store it), each written
    in the largest unit that divides its period (``"10/s"``, ``"5/10s"``, ``"2/h"``)."""
    rates = []
    for part in filter(None, spec.split(",")):
        limit, period_us = (int(number) for number in part.split(":"))
        unit = next(u for u in "dhms" if u == "s" or period_us % _UNITS_US[u] == 0)
        count = period_us // _UNITS_US[unit]
        rates.append(Rate(limit, period_us, f"{limit}/{'' if count == 1 else count}{unit}"))
    return tuple(rates)


def check_cost(cost: object, argument: str = "cost") -> int:
    """``cost`` if it is an int from 1 to :data:`MAX_COST` (bool excluded), else raise."""
    if isinstance(cost, int) and not isinstance(cost, bool) and 1 <= cost <= MAX_COST:
        return cost
    raise ConfigurationError(f"{argument} must be an int from 1 to {MAX_COST}, got {cost!r}")
