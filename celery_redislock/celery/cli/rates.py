"""``celery redislock rates``: the global rate limiters, and a temporary rate without a
deploy (issue #25).

``rates`` lists each limiter (its rates, the override in force, when it admits next,
its parked runs and the oldest one's wait); ``rates NAME`` shows one; ``rates NAME
--set RATE --for SECONDS`` admits by RATE instead, in every worker, until the time is
up (an API that lowered its quota for an hour); ``rates NAME --clear`` ends it;
``rates NAME --reset`` forgets its charges and penalty (:meth:`RedisRateLimiter.reset
<celery_redislock.core.ratelimit.RedisRateLimiter.reset>`: a temporary rate stays, as
the API's reset keeps it; with ``--clear`` both). Imports click and the standard
library when loaded (see :mod:`.group`).
"""

from __future__ import annotations

import math
from typing import Any, Final

import click

from .group import NotFound, connect, emit_json, json_option, redis_errors, redislock

__all__ = ["DEFAULT_FOR", "rates_command"]

DEFAULT_FOR: Final = 3600.0
"""Seconds a temporary rate holds when ``--set`` has no ``--for``."""


@redislock.command(name="rates")
@click.argument("name", required=False)
@click.option(
    "--set",
    "set_rate",
    metavar="RATE",
    default=None,
    help="Admit by RATE (e.g. '5/s', or '5/s,100/m') instead of the configured rates.",
)
@click.option(
    "--for",
    "seconds",
    type=float,
    default=None,
    help=f"With --set: seconds the temporary rate holds.  [default: {DEFAULT_FOR:g}]",
)
@click.option("--clear", is_flag=True, help="End the temporary rate of NAME now.")
@click.option(
    "--reset",
    is_flag=True,
    help="Forget NAME's charges and penalty: its full rate is admitted at once "
    "(a temporary rate stays; add --clear to end it too).",
)
@json_option
@click.pass_context
def rates_command(
    ctx: click.Context,
    name: str | None,
    set_rate: str | None,
    seconds: float | None,
    clear: bool,
    reset: bool,
    as_json: bool,
) -> None:
    """Show the global rate limiters (every one, or NAME), set/clear NAME's
    temporary rate, or reset NAME's charges (the temporary rate stays).

    \b
    Columns: NAME, RATES (configured), OVERRIDE (the temporary rate and its seconds
    left), NEXT (seconds until a run is admitted; 0: now), PARKED (runs waiting for
    an admission), OLDEST (seconds the oldest parked run has waited).

    \b
    JSON (--json): [{"name": str, "rates": [str], "override": str|null,
    "override_left": float, "next": float, "penalty_left": float, "parked": int,
    "claimed": int, "oldest_wait": float|null}, ...]
    """
    from ...core.parking import ParkingQueue, RateCapacity
    from ...core.ratelimit import RedisRateLimiter, limiter_names
    from ...core.ratelimit_rates import parse_rates
    from ...errors import ConfigurationError

    # Refused before anything changes, naming the options: a --for without --set, or
    # --set with --clear, was ignored without a word; a bad --for was blamed on --set.
    if seconds is not None and set_rate is None:
        raise click.UsageError(f"--for {seconds:g} goes with --set RATE (the rate it holds)")
    if set_rate is not None and clear:
        raise click.UsageError("--set and --clear contradict each other: give one")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise click.BadParameter(
            f"seconds the temporary rate holds, a finite number > 0, got {seconds:g}",
            param_hint="--for",
        )
    override = None if set_rate is None else [r.strip() for r in set_rate.split(",")]
    if override is not None:
        try:  # as the help writes it (RATE), one rate not shown as a list of one
            parse_rates(override[0] if len(override) == 1 else override, "RATE")
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="--set") from None
    conn = connect(ctx)
    with redis_errors(conn.url):
        names = [name] if name else limiter_names(conn.client, prefix=conn.prefix)
        if (set_rate is not None or clear or reset) and not name:
            raise click.UsageError("--set, --clear and --reset need a NAME")
        rows: list[dict[str, Any]] = []
        for each in names:
            limiter = RedisRateLimiter.attach(conn.client, each, prefix=conn.prefix)
            if limiter is None:
                raise NotFound(
                    f"no rate limiter named {each!r} under prefix {conn.prefix!r} at "
                    f"{conn.url} (`celery redislock rates` lists them)"
                )
            if override is not None:
                try:
                    limiter.override(override, DEFAULT_FOR if seconds is None else seconds)
                except ConfigurationError as exc:
                    raise click.BadParameter(str(exc), param_hint="--set") from exc
            elif clear:
                limiter.clear_override()
            if reset:
                limiter.reset()
            info = limiter.info()
            rates = [rate.text for rate in limiter.rates]
            queue = ParkingQueue(
                RateCapacity(conn.client, each, rate=rates, prefix=conn.prefix), reserve_ttl=1
            )
            parked = queue.parking_info()
            rows.append(
                {
                    "name": each,
                    "rates": rates,
                    "override": info.override,
                    "override_left": round(info.override_left, 3),
                    "next": round(info.wait, 3),
                    "penalty_left": round(info.penalty_left, 3),
                    "parked": parked.parked,
                    "claimed": parked.claimed,
                    "oldest_wait": None
                    if parked.oldest_age is None
                    else round(parked.oldest_age, 3),
                }
            )
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no rate limiter under prefix {conn.prefix!r} at {conn.url}")
        return
    head = ("NAME", "RATES", "OVERRIDE", "NEXT", "PARKED", "OLDEST")
    table = [
        (
            row["name"],
            ", ".join(row["rates"]),
            f"{row['override']} ({row['override_left']:.0f}s left)" if row["override"] else "-",
            f"{row['next']:.3f}s",
            str(row["parked"]),
            "-" if row["oldest_wait"] is None else f"{row['oldest_wait']:.1f}s",
        )
        for row in rows
    ]
    widths = [max(len(str(r[i])) for r in (head, *table)) for i in range(len(head))]
    for r in (head, *table):
        click.echo(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(r, widths, strict=True)
            ).rstrip()
        )
