"""``list`` and ``inspect`` over Redlock masters (``redislock_urls``): every master is
read, and each lock is shown per master with how many of them hold it.

Imports only ``click`` and the standard library at module level (see :mod:`.group`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .group import (
    _META_KEY,
    Connection,
    NotFound,
    Unavailable,
    _app,
    _Options,
    emit_json,
    kinds,
    redis_errors,
    server_time,
)

if TYPE_CHECKING:
    from ...core.inventory import Entry

__all__ = [
    "MasterView",
    "inspect_masters",
    "list_masters",
    "redlock_connections",
    "release_on_masters",
]

MasterView = tuple[Connection, "list[Entry] | None", str]
"""One master as read: its connection, its entries (None when unreadable), the error."""


def redlock_connections(ctx: click.Context) -> list[Connection] | None:
    """A connection per master when the app sets ``redislock_urls`` (and ``--url``
    was not given), else None."""
    options: _Options = ctx.meta.get(_META_KEY, _Options(None, None))
    app = _app(ctx)
    if options.url is not None or app.conf.get("redislock_urls") is None:
        return None
    from kombu.utils.url import maybe_sanitize_url

    from ...core.keys import DEFAULT_PREFIX
    from ...errors import ConfigurationError
    from ..config import check_prefix
    from ..redlock import redlock_clients

    try:
        prefix = (
            check_prefix(options.prefix, "--prefix")
            if options.prefix is not None
            else check_prefix(app.conf.get("redislock_prefix", DEFAULT_PREFIX), "redislock_prefix")
        )
        clients = redlock_clients(app)
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from exc
    assert clients is not None
    urls = app.conf.get("redislock_urls")
    return [
        Connection(client, str(maybe_sanitize_url(url)), prefix)
        for client, url in zip(clients, urls, strict=True)
    ]


def _read(conns: list[Connection], kind: str | None, name: str | None) -> list[MasterView]:
    from ...core.inventory import find, snapshot
    from ..tokens import parse_owner

    views: list[MasterView] = []
    for conn in conns:
        try:
            with redis_errors(conn.url):
                if name is None:
                    entries = snapshot(conn.client, conn.prefix, kinds(kind), parse_owner)
                else:
                    entries = find(conn.client, conn.prefix, name, kinds(kind), parse_owner)
            views.append((conn, entries, ""))
        except Unavailable as exc:
            views.append((conn, None, exc.message))
    return views


def _holding(views: list[MasterView]) -> dict[tuple[str, str], int]:
    """How many masters hold each (kind, name)."""
    counts: dict[tuple[str, str], int] = {}
    for _, entries, _ in views:
        for entry in entries or []:
            key = (entry.kind, entry.name)
            counts[key] = counts.get(key, 0) + (1 if entry.holders else 0)
    return counts


def _document(views: list[MasterView], prefix: str) -> dict[str, object]:
    quorum = len(views) // 2 + 1
    held = _holding(views)
    masters: list[dict[str, object]] = []
    for conn, entries, error in views:
        if entries is None:
            masters.append({"url": conn.url, "error": error})
        else:
            masters.append(
                {
                    "url": conn.url,
                    "server_time": server_time(conn.client),
                    "primitives": [entry.to_json() for entry in entries],
                }
            )
    return {
        "redlock": True,
        "prefix": prefix,
        "quorum": quorum,
        "held_by_majority": sorted(name for (_, name), count in held.items() if count >= quorum),
        "masters": masters,
    }


def _render(views: list[MasterView], one: bool) -> str:
    from .render import render_entry, render_list

    quorum = len(views) // 2 + 1
    counts = _holding(views)
    lines = [f"Redlock over {len(views)} masters (a lock is held with {quorum} of them):"]
    for (kind, name), count in sorted(counts.items()):
        state = "held by a majority" if count >= quorum else "not held by a majority"
        lines.append(f"  {kind} {name!r}: held on {count} of {len(views)} masters, {state}")
    for conn, entries, error in views:
        lines.append("")
        lines.append(f"== master {conn.url} ==")
        if entries is None:
            lines.append(f"unreachable: {error}")
        elif not entries:
            lines.append("nothing held or waited for")
        elif one:
            lines.append(render_entry(entries[0], prefix=conn.prefix, now=server_time(conn.client)))
        else:
            lines.append(render_list(entries))
    return "\n".join(lines)


def list_masters(conns: list[Connection], kind: str | None, as_json: bool) -> None:
    """``list`` over every master."""
    views = _read(conns, kind, None)
    if as_json:
        emit_json(_document(views, conns[0].prefix))
    else:
        click.echo(_render(views, one=False))


def inspect_masters(conns: list[Connection], name: str, kind: str | None, as_json: bool) -> None:
    """``inspect NAME`` on every master; unknown on all of them: exit 3."""
    views = _read(conns, kind, name)
    if all(not entries for _, entries, _ in views):
        if all(entries is None for _, entries, _ in views):
            raise Unavailable(
                "no Redlock master could be read: " + "; ".join(error for _, _, error in views)
            )
        raise NotFound(
            f"no lock or semaphore named {name!r} is held or waited for on any "
            f"of the {len(views)} Redlock masters"
        )
    if as_json:
        emit_json(_document(views, conns[0].prefix))
    else:
        click.echo(_render(views, one=True))


def release_on_masters(
    conns: list[Connection],
    name: str,
    kind: str | None,
    owner: str | None,
    confirm: Callable[[str, Entry], None],
    as_json: bool,
) -> None:
    """``release NAME`` on every Redlock master: by owner (checked on each master), or
    by force after ``confirm(label, entry)``; an unreachable master is named (its
    copy of the lease expires with its TTL)."""
    from ...core.inventory import force_release, matching_owners, release_owner
    from .group import CommandError

    views = _read(conns, kind, name)
    down = [conn.url for conn, entries, _ in views if entries is None]
    held = [(conn, entries[0]) for conn, entries, _ in views if entries and entries[0].held]
    if not held:
        raise NotFound(
            f"no lock named {name!r} is held on any of the {len(conns)} Redlock "
            "masters: nothing to release"
        )
    label = f"{held[0][1].kind} {name!r}"
    if owner is None:
        confirm(label, held[0][1])
    released, owners = 0, set[str]()
    for conn, entry in held:
        with redis_errors(conn.url):
            if owner is None:
                released += force_release(conn.client, conn.prefix, entry)
                owners.update(h.owner for h in entry.holders if h.owner)
            else:
                for match in matching_owners(entry, owner):
                    count = release_owner(conn.client, conn.prefix, entry, match)
                    released += count
                    if count:
                        owners.add(match)
    if released == 0:
        raise CommandError(f"nothing released: {label} is not held by {owner!r} on any master")
    if as_json:
        emit_json(
            {
                "kind": held[0][1].kind,
                "name": name,
                "released": released,
                "owners": sorted(owners),
                "unreachable": down,
            }
        )
    else:
        where = (
            f"; unreachable (their copies expire with their TTL): {', '.join(down)}" if down else ""
        )
        click.echo(
            f"Released {label} on the Redlock masters ({released} leases, owner "
            f"{', '.join(sorted(owners)) or '-'}){where}."
        )
