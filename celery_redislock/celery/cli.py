"""``celery -A proj redislock ...``: list, inspect, release and watch locks and semaphores.

Registered through the ``celery.commands`` entry point. ``celery`` imports every
command plugin at start-up (also to start a worker), so this module imports only
``click`` and the standard library; Redis, the core and the app's settings are loaded
when a command runs.

Exit codes: 0 success; 1 refused or nothing released (owner mismatch, no
confirmation, unsupported); 2 usage error (also: a name that is both a lock and a
semaphore without ``--kind``); 3 unknown name (nothing holds or waits for it);
4 Redis unreachable or misconfigured.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

if TYPE_CHECKING:
    from ..core.inventory import Entry

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "CommandError",
    "NotFound",
    "Unavailable",
    "redislock",
]

EXIT_REFUSED: Final = 1
"""Exit code: refused, declined or nothing released."""

EXIT_NOT_FOUND: Final = 3
"""Exit code: no lock or semaphore of that name is held or waited for."""

EXIT_UNAVAILABLE: Final = 4
"""Exit code: Redis unreachable, or the connection settings are wrong."""

_KINDS: Final = ("lock", "semaphore")
_META_KEY: Final = "celery_redislock.cli"

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """Refused, declined or nothing released: ``Error: message`` on stderr, exit 1."""

    exit_code = EXIT_REFUSED


class NotFound(CommandError):
    """No lock or semaphore of that name is held or waited for: exit 3."""

    exit_code = EXIT_NOT_FOUND


class Unavailable(CommandError):
    """Redis is unreachable or the connection settings are wrong: exit 4."""

    exit_code = EXIT_UNAVAILABLE


@dataclass
class _Connection:
    """What a command talks to: the client, the URL shown to users, the key prefix."""

    client: Any
    url: str
    prefix: str


@dataclass(frozen=True)
class _Options:
    url: str | None
    prefix: str | None


def _app(ctx: click.Context) -> Any:
    app = getattr(ctx.find_root().obj, "app", None)
    if app is None:  # invoked outside the celery command (e.g. a test runner)
        from celery import current_app

        app = current_app
    return app


def _connect(ctx: click.Context) -> _Connection:
    """Resolve the URL and prefix (options first, then the app) and make the client."""
    from kombu.utils.url import maybe_sanitize_url

    from ..core.keys import DEFAULT_PREFIX
    from ..errors import ConfigurationError
    from .client import get_redis, redis_url
    from .config import check_prefix

    options: _Options = ctx.meta.get(_META_KEY, _Options(None, None))
    app = _app(ctx)
    try:
        prefix = (
            check_prefix(options.prefix, "--prefix")
            if options.prefix is not None
            else check_prefix(app.conf.get("redislock_prefix", DEFAULT_PREFIX), "redislock_prefix")
        )
        if options.url is not None:
            import redis

            url = options.url
            try:
                client = redis.Redis.from_url(url)
            except ValueError as exc:
                raise ConfigurationError(f"--url {maybe_sanitize_url(url)!r}: {exc}") from exc
        else:
            try:
                url = redis_url(app)
            except ConfigurationError as exc:
                hint = " (or pass -A with your app, or --url, to `celery redislock`)"
                raise ConfigurationError(f"{exc}{hint}") from exc
            client = get_redis(app)
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from exc
    return _Connection(client, str(maybe_sanitize_url(url)), prefix)


@contextlib.contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Turn Redis and configuration errors into a one-line message naming the URL."""
    from redis.exceptions import ConnectionError, RedisError, TimeoutError

    from ..errors import ConfigurationError

    try:
        yield
    except (ConnectionError, TimeoutError) as exc:
        raise Unavailable(f"cannot reach Redis at {url}: {exc}") from exc
    except RedisError as exc:
        raise Unavailable(f"Redis at {url} answered: {exc}") from exc
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from exc


def _server_time(client: Any) -> float:
    reply = client.time()
    if isinstance(reply, dict):  # a cluster client may answer per node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds) + int(micros) / 1e6


def _kinds(kind: str | None) -> tuple[str, ...]:
    return _KINDS if kind is None else (kind,)


def _resolve(conn: _Connection, name: str, kind: str | None) -> Entry:
    """The one primitive called ``name``, else a not-found or ambiguity error."""
    from ..core.inventory import find
    from .tokens import parse_owner

    entries = find(conn.client, conn.prefix, name, _kinds(kind), parse_owner)
    if not entries:
        what = kind or "lock or semaphore"
        raise NotFound(
            f"no {what} named {name!r} is held or waited for under prefix "
            f"{conn.prefix!r} at {conn.url} (a free one leaves no trace in Redis; "
            "`celery redislock list` shows the names)"
        )
    if len(entries) > 1:
        raise click.UsageError(
            f"{name!r} is both a lock and a semaphore: pass --kind lock or --kind semaphore"
        )
    return entries[0]


def _emit_json(document: Any, *, compact: bool = False) -> None:
    if compact:
        click.echo(json.dumps(document, separators=(",", ":")))
    else:
        click.echo(json.dumps(document, indent=2))


def _kind_option(help_text: str) -> Callable[[F], F]:
    return click.option("--kind", type=click.Choice(_KINDS), default=None, help=help_text)


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table."
)


@click.group(name="redislock")
@click.option(
    "--url",
    metavar="URL",
    default=None,
    help="Redis URL to use instead of the app's redislock_url (or its Redis broker URL).",
)
@click.option(
    "--prefix",
    metavar="PREFIX",
    default=None,
    help="Key prefix to use instead of the app's redislock_prefix (default 'redislock').",
)
@click.pass_context
def redislock(ctx: click.Context, url: str | None, prefix: str | None) -> None:
    """Inspect and release celery_redislock's locks and semaphores.

    Redis is the app's redislock_url, else its broker URL when that is Redis;
    the keys are those under redislock_prefix. Only primitives that something
    holds or waits for exist in Redis, so only those are shown.

    \b
    Exit codes: 0 ok; 1 refused or nothing released; 2 usage error;
    3 unknown name; 4 Redis unreachable or misconfigured.
    """
    ctx.meta[_META_KEY] = _Options(url, prefix)


@redislock.command(name="list")
@_kind_option("Only locks, or only semaphores.")
@_json_option
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
    from ..core.inventory import snapshot
    from .cli_render import render_list
    from .tokens import parse_owner

    conn = _connect(ctx)
    with _redis_errors(conn.url):
        entries = snapshot(conn.client, conn.prefix, _kinds(kind), parse_owner)
        now = _server_time(conn.client) if as_json else None
    if as_json:
        _emit_json(_list_document(conn, entries, now))
    elif not entries:
        click.echo(f"Nothing held or waited for under prefix {conn.prefix!r} at {conn.url}.")
    else:
        click.echo(render_list(entries))


def _list_document(conn: _Connection, entries: list[Entry], now: float | None) -> dict[str, Any]:
    return {
        "url": conn.url,
        "prefix": conn.prefix,
        "server_time": now,
        "primitives": [entry.to_json() for entry in entries],
    }


@redislock.command(name="inspect")
@click.argument("name")
@_kind_option("Look NAME up as a lock or as a semaphore (needed if it is both).")
@_json_option
@click.pass_context
def inspect_command(ctx: click.Context, name: str, kind: str | None, as_json: bool) -> None:
    """Show one lock or semaphore in detail: owner, since, fence, every lease.

    An unknown NAME (nothing holds or waits for it) exits with code 3.

    \b
    JSON (--json), stable keys:
      {"url": str, "prefix": str, "server_time": float, "primitive": PRIMITIVE}
    with PRIMITIVE as in `celery redislock list --help`.
    """
    from .cli_render import render_entry

    conn = _connect(ctx)
    with _redis_errors(conn.url):
        entry = _resolve(conn, name, kind)
        now = _server_time(conn.client)
    if as_json:
        _emit_json(
            {
                "url": conn.url,
                "prefix": conn.prefix,
                "server_time": now,
                "primitive": entry.to_json(),
            }
        )
    else:
        click.echo(render_entry(entry, prefix=conn.prefix, now=now))


def _describe_holders(entry: Entry) -> str:
    if not entry.holders:
        return "nobody (only waiters)"
    parts = []
    for h in entry.holders:
        who = f"task {h.task_id}" if h.state else (h.owner or "an anonymous holder")
        state = f", {h.state}" if h.state else ""
        parts.append(f"{who}{state}, ttl {h.ttl:.1f}s, fence {h.fence}")
    return "; ".join(parts)


@redislock.command(name="release")
@click.argument("name")
@click.option(
    "--owner",
    metavar="TASK_ID_OR_OWNER",
    default=None,
    help="Release only the leases of this owner: a task id, or a full owner id.",
)
@click.option("--force", is_flag=True, help="Release whoever holds it (asks first).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before --force.")
@_kind_option("Look NAME up as a lock or as a semaphore (needed if it is both).")
@_json_option
@click.pass_context
def release_command(
    ctx: click.Context,
    name: str,
    owner: str | None,
    force: bool,
    yes: bool,
    kind: str | None,
    as_json: bool,
) -> None:
    """Release a stuck lock: by owner (safe), or by force after confirmation.

    \b
    --owner X  releases the leases whose owner id is X, or whose task id is X
               (owner ids of tasks are "<task id>#<nonce>" while queued and
               "<task id>@<nonce>" while running). Checked atomically on the
               server: nothing is released if someone else holds it meanwhile.
    --force    releases every lease, whoever holds it, after asking; --yes skips
               the question; without a terminal and without --yes it refuses.

    A released task is not stopped: its lease reports itself lost at its next
    renewal. Semaphores are released this way only if this version of the core
    supports it (otherwise the command says so; their leases expire with their TTL).

    \b
    JSON (--json): {"kind": str, "name": str, "released": int (leases),
                    "owners": [str, ...] (owner ids released)}
    """
    from ..core.inventory import UnsupportedOperation, check_release, matching_owners

    if owner is not None and force:
        raise click.UsageError("--owner and --force exclude each other")
    if owner is None and not force:
        raise click.UsageError(
            "say whose lease to release: --owner TASK_ID_OR_OWNER (safe), or --force"
        )
    conn = _connect(ctx)
    with _redis_errors(conn.url):
        entry = _resolve(conn, name, kind)
        label = f"{entry.kind} {entry.name!r}"
        if not entry.held:
            raise CommandError(f"{label} is not held ({entry.waiters} waiting): nothing to release")
        try:
            check_release(entry, force=force)
        except UnsupportedOperation as exc:
            raise CommandError(str(exc)) from exc
        if owner is not None:
            owners = matching_owners(entry, owner)
            if not owners:
                raise CommandError(
                    f"{label} is not held by {owner!r} (held by "
                    f"{_describe_holders(entry)}): nothing released"
                )
            released = _release_owners(conn, entry, owners)
        else:
            owners = sorted({h.owner for h in entry.holders if h.owner})
            _confirm_force(label, entry, yes)
            released = _force(conn, entry)
    if released == 0:
        raise CommandError(f"nothing released: {label} changed hands or expired meanwhile")
    if as_json:
        _emit_json({"kind": entry.kind, "name": entry.name, "released": released, "owners": owners})
    else:
        leases = f"{released} lease{'' if released == 1 else 's'}"
        whose = f", owner {', '.join(owners)}" if owners else ""
        click.echo(f"Released {label} ({leases}{whose}).")


def _release_owners(conn: _Connection, entry: Entry, owners: list[str]) -> int:
    from ..core.inventory import release_owner

    return sum(release_owner(conn.client, conn.prefix, entry, o) for o in owners)


def _force(conn: _Connection, entry: Entry) -> int:
    from ..core.inventory import force_release

    return force_release(conn.client, conn.prefix, entry)


def _confirm_force(label: str, entry: Entry, yes: bool) -> None:
    """Ask before a forced release; refuse without a terminal unless ``--yes``."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(
            f"refusing to force-release {label} without confirmation: stdin is not a "
            "terminal; pass --yes to confirm"
        )
    click.echo(f"{label} is held by {_describe_holders(entry)}.", err=True)
    if not click.confirm(f"Force-release {label}?", default=False, err=True):
        raise CommandError("not confirmed: nothing released")


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
@_kind_option("Only locks, or only semaphores.")
@_json_option
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
    from .cli_render import render_list

    conn = _connect(ctx)
    failed = False
    try:
        for n in range(count if count is not None else sys.maxsize):
            if n:
                time.sleep(interval)
            failed, entries, now, error = _refresh(conn, kind)
            if as_json:
                _emit_json({"error": error} if failed else _list_document(conn, entries, now),
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


def _refresh(conn: _Connection, kind: str | None) -> tuple[bool, list[Entry], float | None, str]:
    """One read for `watch`: ``(failed, entries, server time, error message)``."""
    from ..core.inventory import snapshot
    from .tokens import parse_owner

    try:
        with _redis_errors(conn.url):
            entries = snapshot(conn.client, conn.prefix, _kinds(kind), parse_owner)
            return False, entries, _server_time(conn.client), ""
    except CommandError as exc:
        return True, [], None, exc.message
