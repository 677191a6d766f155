"""The read-only commands: ``list``, ``inspect`` and ``watch``.

Imports only ``click`` and the standard library at module level (see :mod:`.group`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from .group import (
    EXIT_UNAVAILABLE,
    CommandError,
    Connection,
    connect,
    emit_json,
    json_option,
    kind_option,
    kinds,
    redis_errors,
    redislock,
    resolve,
    server_time,
)

if TYPE_CHECKING:
    from ...core.inventory import Entry


@redislock.command(name="list")
@kind_option("Only locks, or only semaphores.")
@json_option
@click.pass_context
def list_command(ctx: click.Context, kind: str | None, as_json: bool) -> None:
    """List every lock and semaphore held or waited for, with its holders.

    One row per holder: the task id (or owner id) holding it, whether that task is
    queued (lease taken when it was sent) or running, the lease's TTL left unless
    renewed, and its fencing token. HELD is held/free for a lock and held/limit for
    a semaphore.

    \b
    JSON (--json), stable keys:
      {"url": str (password masked), "prefix": str, "server_time": float,
       "primitives": [PRIMITIVE, ...]}
      PRIMITIVE: {"kind": "lock"|"semaphore", "name": str, "held": bool,
       "holders": [HOLDER, ...], "waiters": int, "limit": int|null,
       "available": int|null, "ttl": float, "fence": int|null,
       "since": float|null}
      HOLDER: {"owner": str|null, "task_id": str|null,
       "state": "queued"|"running"|null, "ttl": float, "fence": int|null,
       "token": str (first 8 characters only)}
    Times are seconds; "since" and "server_time" are epoch seconds of the
    Redis server's clock; "limit"/"available" are null for locks.
    """
    from ...core.inventory import snapshot
    from ..tokens import parse_owner
    from .masters import list_masters, redlock_connections
    from .render import render_list

    masters = redlock_connections(ctx)
    if masters is not None:  # redislock_urls: every master, lock by lock
        list_masters(masters, kind, as_json)
        return
    conn = connect(ctx)
    with redis_errors(conn.url):
        entries = snapshot(conn.client, conn.prefix, kinds(kind), parse_owner)
        now = server_time(conn.client) if as_json else None
    if as_json:
        emit_json(_list_document(conn, entries, now))
    elif not entries:
        click.echo(f"Nothing held or waited for under prefix {conn.prefix!r} at {conn.url}.")
    else:
        click.echo(render_list(entries))


def _list_document(conn: Connection, entries: list[Entry], now: float | None) -> dict[str, Any]:
    return {
        "url": conn.url,
        "prefix": conn.prefix,
        "server_time": now,
        "primitives": [entry.to_json() for entry in entries],
    }


@redislock.command(name="inspect")
@click.argument("name")
@kind_option("Look NAME up as a lock or as a semaphore (needed if it is both).")
@json_option
@click.pass_context
def inspect_command(ctx: click.Context, name: str, kind: str | None, as_json: bool) -> None:
    """Show one lock or semaphore in detail: owner, since, fence, every lease.

    An unknown NAME (nothing holds or waits for it) exits with code 3.

    \b
    JSON (--json), stable keys:
      {"url": str, "prefix": str, "server_time": float, "primitive": PRIMITIVE}
    with PRIMITIVE as in `celery redislock list --help`.
    """
    from .masters import inspect_masters, redlock_connections
    from .render import render_entry

    masters = redlock_connections(ctx)
    if masters is not None:  # redislock_urls: NAME on every master
        inspect_masters(masters, name, kind, as_json)
        return
    conn = connect(ctx)
    with redis_errors(conn.url):
        entry = resolve(conn, name, kind)
        now = server_time(conn.client)
    if as_json:
        emit_json(
            {
                "url": conn.url,
                "prefix": conn.prefix,
                "server_time": now,
                "primitive": entry.to_json(),
            }
        )
    else:
        click.echo(render_entry(entry, prefix=conn.prefix, now=now))


@redislock.command(name="watch")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many refreshes (default: until Ctrl-C).",
)
@kind_option("Only locks, or only semaphores.")
@json_option
@click.pass_context
def watch_command(
    ctx: click.Context, interval: float, count: int | None, kind: str | None, as_json: bool
) -> None:
    """Refresh the `list` table every --interval seconds.

    On a terminal the screen is cleared before each refresh; otherwise the tables
    follow one another. A refresh that cannot reach Redis shows the error and the
    watch goes on; with --count the exit code is 4 if the last refresh failed.
    With --json each refresh prints one line: the `list --json` document, or
    {"error": str} when Redis could not be read.
    """
    from .render import render_list

    conn = connect(ctx)
    failed = False
    try:
        for n in range(count if count is not None else sys.maxsize):
            if n:
                time.sleep(interval)
            failed, entries, now, error = _refresh(conn, kind)
            if as_json:
                emit_json({"error": error} if failed else _list_document(conn, entries, now),
                           compact=True)  # fmt: skip
                continue
            click.clear()  # only on a terminal
            if n and not sys.stdout.isatty():
                click.echo()
            stamp = time.strftime("%H:%M:%S", time.localtime())
            click.echo(
                f"redislock at {conn.url}, prefix {conn.prefix!r}, {stamp}: "
                f"{len(entries)} held or waited for (every {interval:g}s; Ctrl-C to stop)"
            )
            if failed:
                click.echo(f"Error: {error}")
            else:
                click.echo(render_list(entries) if entries else "Nothing held or waited for.")
    except KeyboardInterrupt:
        return
    if failed:
        ctx.exit(EXIT_UNAVAILABLE)


def _refresh(conn: Connection, kind: str | None) -> tuple[bool, list[Entry], float | None, str]:
    """One read for `watch`: ``(failed, entries, server time, error message)``."""
    from ...core.inventory import snapshot
    from ..tokens import parse_owner

    try:
        with redis_errors(conn.url):
            entries = snapshot(conn.client, conn.prefix, kinds(kind), parse_owner)
            return False, entries, server_time(conn.client), ""
    except CommandError as exc:
        return True, [], None, exc.message
