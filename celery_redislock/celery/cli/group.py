"""The ``celery redislock`` command group: its options, exit codes and shared helpers.

The commands live beside it (:mod:`.show`, :mod:`.release`). ``celery`` imports every
command plugin at start-up (also to start a worker), so these modules import only
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

if TYPE_CHECKING:
    from celery import Celery

    from ...core.inventory import Entry
    from ...core.scripts import RedisClient

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
class Connection:
    """What a command talks to: the client, the URL shown to users, the key prefix."""

    client: RedisClient
    url: str
    prefix: str


@dataclass(frozen=True)
class _Options:
    url: str | None
    prefix: str | None


def _app(ctx: click.Context) -> Celery:
    app: Celery | None = getattr(ctx.find_root().obj, "app", None)
    if app is None:  # invoked outside the celery command (e.g. a test runner)
        from celery import current_app

        app = current_app
    return app


def connect(ctx: click.Context) -> Connection:
    """Resolve the URL and prefix (options first, then the app) and make the client."""
    from kombu.utils.url import maybe_sanitize_url

    from ...core.keys import DEFAULT_PREFIX
    from ...errors import ConfigurationError
    from ..client import get_redis, redis_url
    from ..config import check_prefix

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
            client: RedisClient
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
    return Connection(client, str(maybe_sanitize_url(url)), prefix)


@contextlib.contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Turn Redis and configuration errors into a one-line message naming the URL."""
    from redis.exceptions import ConnectionError, RedisError, TimeoutError

    from ...errors import ConfigurationError

    try:
        yield
    except (ConnectionError, TimeoutError) as exc:
        raise Unavailable(f"cannot reach Redis at {url}: {exc}") from exc
    except RedisError as exc:
        raise Unavailable(f"Redis at {url} answered: {exc}") from exc
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from exc


def server_time(client: RedisClient) -> float:
    """The Redis server's clock, epoch seconds."""
    reply = client.time()
    if isinstance(reply, dict):  # a cluster client may answer per node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds) + int(micros) / 1e6


def kinds(kind: str | None) -> tuple[str, ...]:
    """The kinds a ``--kind`` value selects (both when it is not given)."""
    return _KINDS if kind is None else (kind,)


def resolve(conn: Connection, name: str, kind: str | None) -> Entry:
    """The one primitive called ``name``, else a not-found or ambiguity error."""
    from ...core.inventory import find
    from ..tokens import parse_owner

    entries = find(conn.client, conn.prefix, name, kinds(kind), parse_owner)
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


def emit_json(document: object, *, compact: bool = False) -> None:
    """Print ``document`` as JSON: indented, or on one line with ``compact``."""
    if compact:
        click.echo(json.dumps(document, separators=(",", ":")))
    else:
        click.echo(json.dumps(document, indent=2))


def kind_option(help_text: str) -> Callable[[F], F]:
    """The ``--kind lock|semaphore`` option, with the command's own help text."""
    return click.option("--kind", type=click.Choice(_KINDS), default=None, help=help_text)


json_option = click.option(
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
    """Show celery_redislock's locks, semaphores, rate limiters and beat leader.

    Release stuck locks (release), change a rate limiter for a while (rates),
    serve metrics (exporter).

    Redis is the app's redislock_url, else its broker URL when that is Redis;
    the keys are those under redislock_prefix. Only primitives that something
    holds or waits for exist in Redis, so only those are shown.

    \b
    Exit codes: 0 ok; 1 refused or nothing released; 2 usage error;
    3 unknown name; 4 Redis unreachable or misconfigured.
    """
    ctx.meta[_META_KEY] = _Options(url, prefix)
