"""``celery redislock exporter`` (Prometheus metrics and the live page) and
``celery redislock top`` (the same view, refreshing in the terminal) (#27).

Imports only ``click`` and the standard library at module level (see :mod:`.group`);
``prometheus_client`` (the ``metrics`` extra) when the exporter starts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import click

from .group import connect, redis_errors, redislock

if TYPE_CHECKING:
    from ...core.inventory import Entry
    from ..metrics.read import State

_DEFAULT_PORT: Final = 10057  # metrics.server.DEFAULT_PORT, not imported at load
_CLEAR: Final = "\x1b[H\x1b[2J"


@redislock.command(name="exporter")
@click.option("--host", default="", show_default=False, help="Address to bind (default: all).")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=_DEFAULT_PORT,
    show_default=True,
    help="TCP port of /metrics and the live page.",
)
@click.option(
    "--max-names",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="Pools and limiters exported per scrape, at most (the rest counted as omitted).",
)
@click.pass_context
def exporter_command(ctx: click.Context, host: str, port: int, max_names: int) -> None:
    """Serve Prometheus metrics on /metrics and a live page on /.

    Counters are those the workers add to Redis (unless the app sets
    redislock_metrics = False); the gauges (locks held, pools, parked runs,
    limiters' next admission) are read from Redis at each scrape. Needs the
    'metrics' extra: pip install 'celery-redislock[metrics]'.
    """
    try:
        from ..metrics.server import Exporter
    except ImportError as exc:
        raise click.ClickException(
            f"the exporter needs prometheus_client: pip install 'celery-redislock[metrics]' ({exc})"
        ) from exc
    conn = connect(ctx)
    exporter = Exporter(conn.client, conn.prefix, host=host, port=port, max_names=max_names)
    shown = host or "0.0.0.0"
    click.echo(
        f"celery_redislock exporter: http://{shown}:{exporter.port}/metrics and the live page "
        f"on http://{shown}:{exporter.port}/ ({conn.url}, prefix {conn.prefix!r})",
        err=True,
    )
    try:
        exporter.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        exporter.server.server_close()


def render_state(state: State, width: int = 100) -> str:
    """The page's view as text: summary, held locks, pools, limiters."""
    from .render import format_duration, table

    lines = [
        f"locks held: {state.locks_held}   locks waited for: {state.locks_waited}   "
        f"pools: {len(state.pools)}   limiters: {len(state.limiters)}   "
        f"at {time.strftime('%H:%M:%S', time.localtime(state.read_at))}",
        "",
    ]

    def holders_of(entry: Entry) -> str:
        return ", ".join(h.task_id or h.owner or h.token for h in entry.holders)[:width]

    locks = [
        (e.name, holders_of(e), e.holders[0].state or "-", format_duration(e.ttl))
        for e in state.lock_details
    ]
    lines.append("LOCKS")
    lines.append(table(("NAME", "HOLDER", "STATE", "TTL"), locks, "  ") if locks else "  none")
    more = state.locks_held - len(state.lock_details)
    if more > 0:
        lines.append(f"  ... and {more} more (celery redislock list)")
    pools = [
        (
            e.name,
            f"{len(e.holders)}/{'?' if e.limit is None else e.limit}",
            str(e.waiters),
            str(e.parked),
            "-" if e.oldest_parked is None else format_duration(e.oldest_parked),
            str(e.dead),
        )
        for e in state.pools
    ]
    lines += ["", "POOLS"]
    pool_headers = ("NAME", "HELD", "WAITING", "PARKED", "OLDEST", "DEAD")
    lines.append(table(pool_headers, pools, "  ") if pools else "  none")
    limiters = [
        (
            lim.name,
            ", ".join(lim.rates),
            f"{lim.next_admission:.3f}s",
            f"{lim.penalty_left:.1f}s",
            str(lim.parked),
            "-" if lim.oldest_parked is None else format_duration(lim.oldest_parked),
        )
        for lim in state.limiters
    ]
    lines += ["", "RATE LIMITERS"]
    headers = ("NAME", "RATES", "NEXT ADMISSION", "PENALTY", "PARKED", "OLDEST")
    lines.append(table(headers, limiters, "  ") if limiters else "  none")
    return "\n".join(lines)


@redislock.command(name="top")
@click.option(
    "--interval",
    type=click.FloatRange(0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--iterations",
    "-n",
    type=click.IntRange(1),
    default=None,
    help="Stop after this many refreshes (default: until interrupted).",
)
@click.option(
    "--locks",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="Held locks listed one by one, at most.",
)
@click.pass_context
def top_command(ctx: click.Context, interval: float, iterations: int | None, locks: int) -> None:
    """Locks held, pools with holders and backlog, limiters' next admission,
    refreshing in the terminal (Ctrl-C to stop)."""
    from ..metrics.read import read_state
    from ..tokens import parse_owner

    conn = connect(ctx)
    import sys

    clear = _CLEAR if sys.stdout.isatty() else ""
    count = 0
    try:
        while True:
            with redis_errors(conn.url):
                state = read_state(
                    conn.client, conn.prefix, lock_details=locks, parse_owner=parse_owner
                )
            click.echo(clear + render_state(state))
            count += 1
            if iterations is not None and count >= iterations:
                return
            if not clear:
                click.echo("")
            time.sleep(interval)
    except KeyboardInterrupt:
        return
