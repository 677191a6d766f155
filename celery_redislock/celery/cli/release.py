"""The ``release`` command: by owner (task id or owner id), or by force after asking.

Imports only ``click`` and the standard library at module level (see :mod:`.group`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .group import (
    CommandError,
    Connection,
    connect,
    emit_json,
    json_option,
    kind_option,
    redis_errors,
    redislock,
    resolve,
)

if TYPE_CHECKING:
    from ...core.inventory import Entry


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
@click.argument("name", required=False)
@click.option(
    "--all",
    "all_",
    is_flag=True,
    help="Release every lock and semaphore under the prefix (asks first; see below).",
)
@click.option(
    "--match",
    metavar="PATTERN",
    default=None,
    help="With --all: only names matching this glob (e.g. 'report:*').",
)
@click.option(
    "--owner",
    metavar="TASK_ID_OR_OWNER",
    default=None,
    help="Release only the leases of this owner: a task id, or a full owner id.",
)
@click.option("--force", is_flag=True, help="Release whoever holds it (asks first).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before --force or --all.")
@kind_option("Look NAME up as a lock or as a semaphore (needed if it is both).")
@json_option
@click.pass_context
def release_command(
    ctx: click.Context,
    name: str | None,
    all_: bool,
    match: str | None,
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
    --all      (no NAME) releases every live lease of every lock and semaphore under
               the prefix (--kind, --match PATTERN narrow it), each by its exact
               token: a lease granted meanwhile is never touched. Asks first, as
               --force. ONLY while no worker using the prefix runs (crash recovery,
               maintenance): a lock released under a running task lets a second
               copy run beside it. Never on worker start-up (celery-singleton's
               clear_locks on worker_ready releases the other workers' locks).

    A released task is not stopped: its lease reports itself lost at its next
    renewal. Semaphores are released this way only if this version of the core
    supports it (otherwise the command says so; their leases expire with their TTL).

    \b
    JSON (--json): {"kind": str, "name": str, "released": int (leases),
                    "owners": [str, ...] (owner ids released)};
    with --all: {"prefix": str, "kind": str|null, "match": str|null,
                 "released": int (leases)}
    """
    if all_:
        if name is not None or owner is not None or force:
            raise click.UsageError("--all takes no NAME, --owner or --force")
        _release_all(ctx, kind, match, yes, as_json)
        return
    if name is None:
        raise click.UsageError("say which lock to release: NAME, or --all")
    if match is not None:
        raise click.UsageError("--match goes with --all")
    from ...core.inventory import matching_owners

    if owner is not None and force:
        raise click.UsageError("--owner and --force exclude each other")
    if owner is None and not force:
        raise click.UsageError(
            "say whose lease to release: --owner TASK_ID_OR_OWNER (safe), or --force"
        )
    from .masters import redlock_connections, release_on_masters

    masters = redlock_connections(ctx)
    if masters is not None:  # redislock_urls: on every master
        release_on_masters(
            masters,
            name,
            kind,
            owner,
            lambda label, entry: _confirm_force(label, entry, yes),
            as_json,
        )
        return
    conn = connect(ctx)
    with redis_errors(conn.url):
        entry = resolve(conn, name, kind)
        label = f"{entry.kind} {entry.name!r}"
        if not entry.held:
            raise CommandError(f"{label} is not held ({entry.waiters} waiting): nothing to release")
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
        emit_json({"kind": entry.kind, "name": entry.name, "released": released, "owners": owners})
    else:
        leases = f"{released} lease{'' if released == 1 else 's'}"
        whose = f", owner {', '.join(owners)}" if owners else ""
        click.echo(f"Released {label} ({leases}{whose}).")


def _release_owners(conn: Connection, entry: Entry, owners: list[str]) -> int:
    from ...core.inventory import release_owner

    return sum(release_owner(conn.client, conn.prefix, entry, o) for o in owners)


def _force(conn: Connection, entry: Entry) -> int:
    from ...core.inventory import force_release

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


def _release_all(
    ctx: click.Context, kind: str | None, match: str | None, yes: bool, as_json: bool
) -> None:
    """``release --all``: count what is held, ask, then release it all by token."""
    import fnmatch

    from ...core import release_all
    from ...core.inventory import snapshot
    from .masters import redlock_connections

    if redlock_connections(ctx) is not None:
        raise click.UsageError("--all with redislock_urls: run it on each master with --url URL")
    conn = connect(ctx)
    kinds = ("lock", "semaphore") if kind is None else (kind,)
    scope = f"under prefix {conn.prefix!r}" + (f" matching {match!r}" if match else "")
    with redis_errors(conn.url):
        entries = [
            e
            for e in snapshot(conn.client, conn.prefix, kinds)
            if e.held and (match is None or fnmatch.fnmatchcase(e.name, match))
        ]
        leases = sum(len(e.holders) for e in entries)
        if not entries:
            raise CommandError(f"nothing held {scope} at {conn.url}: nothing to release")
        label = (
            f"{leases} lease{'' if leases == 1 else 's'} of {len(entries)} "
            f"lock(s)/semaphore(s) {scope}"
        )
        if not yes:
            if not sys.stdin.isatty():
                raise CommandError(
                    f"refusing to release {label} without confirmation: "
                    "stdin is not a terminal; pass --yes to confirm"
                )
            click.echo("Only safe while no worker using this prefix runs.", err=True)
            if not click.confirm(f"Release {label}?", default=False, err=True):
                raise CommandError("not confirmed: nothing released")
        released = release_all(conn.client, prefix=conn.prefix, match=match, kind=kind)  # type: ignore[arg-type]  # click.Choice
    if as_json:
        emit_json({"prefix": conn.prefix, "kind": kind, "match": match, "released": released})
    else:
        click.echo(f"Released {released} lease{'' if released == 1 else 's'} {scope}.")
