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
    queued (lease taken when it was sent), running, or reserved (a pool's permit a
    release handed to that parked task, on its way to a worker: it takes the permit
    when it starts), the lease's TTL left unless renewed (a reservation's: until it
    lapses and the permit goes to the next run), and its fencing token. HELD is
    held/free for a lock and held/limit for a semaphore; PARKED the runs of a pool
    queued in Redis for a permit (and the oldest one's wait), with the dead-lettered
    ones that could not be decoded.

    \b
    JSON (--json), stable keys:
      {"url": str (password masked), "prefix": str, "server_time": float,
       "primitives": [PRIMITIVE, ...]}
      PRIMITIVE: {"kind": "lock"|"semaphore", "name": str, "held": bool,
       "holders": [HOLDER, ...], "waiters": int, "limit": int|null,
       "available": int|null, "ttl": float, "fence": int|null,
       "since": float|null, "parked": int, "oldest_parked": float|null,
       "dead": int}
      HOLDER: {"owner": str|null, "task_id": str|null,
       "state": "queued"|"running"|"reserved"|null, "ttl": float,
       "fence": int|null,
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

    NAME may also be a task name: then every lock and semaphore of that task is
    listed (its singleton locks are named "<task name>:<hash of the arguments>", its
    pool by default after the task). A NAME that matches nothing held, waited for
    or parked exits with code 3.

    \b
    JSON (--json), stable keys:
      {"url": str, "prefix": str, "server_time": float, "primitive": PRIMITIVE}
    with PRIMITIVE as in `celery redislock list --help`; for a task name
      {"url": str, "prefix": str, "server_time": float, "task": str,
       "primitives": [PRIMITIVE, ...]}
    """
    from .group import NotFound
    from .masters import inspect_masters, redlock_connections
    from .render import render_entry, render_list

    masters = redlock_connections(ctx)
    if masters is not None:  # redislock_urls: NAME on every master
        inspect_masters(masters, name, kind, as_json)
        return
    conn = connect(ctx)
    with redis_errors(conn.url):
        try:
            entry = resolve(conn, name, kind)
        except NotFound:
            task_entries = _of_task(conn, name, kind)
            if not task_entries:
                _if_rate_limiter(conn, name)
                raise
            document = _list_document(conn, task_entries, server_time(conn.client))
            if as_json:
                emit_json({**document, "task": name})
            else:
                click.echo(f"task {name!r}: {len(task_entries)} held, waited for or parked")
                click.echo(render_list(task_entries))
            return
        now = server_time(conn.client)
        dead = _dead_letters(conn, entry) if not as_json else []
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
        click.echo(render_entry(entry, prefix=conn.prefix, now=now, dead_letters=dead))


def _of_task(conn: Connection, task_name: str, kind: str | None) -> list[Entry]:
    """Every primitive of a task: its singleton locks ``<task name>:<hash>``."""
    from ...core.inventory import snapshot
    from ..tokens import parse_owner

    entries = snapshot(conn.client, conn.prefix, kinds(kind), parse_owner)
    return [e for e in entries if e.name.startswith(f"{task_name}:")]


def _dead_letters(conn: Connection, entry: Entry) -> list[tuple[str, float, str]]:
    """The newest dead letters of a semaphore (those ``inspect`` shows)."""
    if entry.kind != "semaphore" or not entry.dead:
        return []
    from ...core.parking import ParkingSemaphore

    sem = ParkingSemaphore(conn.client, entry.name, limit=1, prefix=conn.prefix)
    return [(entry_id, at, reason) for entry_id, at, reason, _ in sem.dead_letters(10)]


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
                emit_json(
                    {"error": error} if failed else _list_document(conn, entries, now), compact=True
                )
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


def _if_rate_limiter(conn: Connection, name: str) -> None:
    """Not found as a lock or semaphore: a rate limiter of that name (a user's
    ``global_rate_key``) is pointed at the command that shows it."""
    from ...core.ratelimit import RedisRateLimiter
    from .group import NotFound

    if RedisRateLimiter.attach(conn.client, name, prefix=conn.prefix) is not None:
        raise NotFound(
            f"{name!r} is a rate limiter, not a lock or semaphore: "
            f"`celery redislock rates {name}` shows it"
        )
