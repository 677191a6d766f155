"""``celery redislock beat``: which beat leads a group, since when, and the last slot
each entry was sent for (see ``celery_redislock.celery.beat``).

Imports only ``click`` and the standard library at module level (see :mod:`.group`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from .group import _app, connect, emit_json, json_option, redis_errors, redislock, server_time

if TYPE_CHECKING:
    from ..beat.claims import BeatState


@redislock.command(name="beat")
@click.option(
    "--group",
    metavar="NAME",
    default=None,
    help="The beat group (default: the app's redislock_beat_group, else 'default').",
)
@json_option
@click.pass_context
def beat_command(ctx: click.Context, group: str | None, as_json: bool) -> None:
    """Show which beat leads, since when, and the last slot sent per entry.

    The leader is the owner id (host:pid:tag) of the beat holding the group's leader
    lease, "since" the time it was granted (Redis server clock). Each entry's last
    slot is the scheduled time of the last run a beat claimed and sent, with when it
    was claimed and by which beat.

    \b
    JSON (--json), stable keys:
      {"url": str, "prefix": str, "group": str, "server_time": float,
       "leader": str|null, "since": float|null,
       "entries": [{"name": str, "slot": float, "claimed_at": float|null,
                    "by": str|null}, ...]}
    Times are epoch seconds.
    """
    from ...core.inventory import describe
    from ...core.validate import check_name
    from ...errors import ConfigurationError
    from ..beat.claims import lock_name, read_state
    from .group import Unavailable

    conn = connect(ctx)
    try:
        name = check_name(
            group if group is not None else _app(ctx).conf.get("redislock_beat_group", "default"),
            "--group" if group is not None else "redislock_beat_group",
        )
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from exc
    with redis_errors(conn.url):
        lock = describe(conn.client, conn.prefix, "lock", lock_name(name))
        leader = lock.holders[0].owner if lock.holders else None
        state = read_state(conn.client, conn.prefix, name, leader, lock.since if leader else None)
        now = server_time(conn.client)
    if as_json:
        emit_json(_document(conn.url, conn.prefix, state, now))
    else:
        click.echo(render_beat(conn.url, state, now))


def _document(url: str, prefix: str, state: BeatState, now: float) -> dict[str, Any]:
    return {
        "url": url,
        "prefix": prefix,
        "group": state.group,
        "server_time": now,
        "leader": state.leader,
        "since": state.since,
        "entries": [
            {"name": e.name, "slot": e.slot, "claimed_at": e.claimed_at, "by": e.by}
            for e in state.entries
        ],
    }


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def render_beat(url: str, state: BeatState, now: float) -> str:
    """The text the command prints."""
    if state.leader is None:
        head = f"Beat group {state.group!r} at {url}: no beat leads."
    else:
        ago = f" ({now - state.since:.1f} s ago)" if state.since is not None else ""
        head = (
            f"Beat group {state.group!r} at {url}: led by {state.leader} "
            f"since {_when(state.since)}{ago}."
        )
    if not state.entries:
        return f"{head}\nNo slot sent yet."
    rows = [("ENTRY", "LAST SLOT SENT", "CLAIMED AT", "BY")]
    rows += [(e.name, _when(e.slot), _when(e.claimed_at), e.by or "-") for e in state.entries]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join([head, *lines])
