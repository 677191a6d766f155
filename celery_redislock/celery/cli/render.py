"""Plain-text rendering for the ``celery redislock`` command: aligned columns, no colours.

Pure functions of :class:`~celery_redislock.core.inventory.Entry` values, standard
library only, so the output is easy to test and to read in any terminal or log.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from ...core.inventory import Entry, Holder

__all__ = ["format_duration", "render_entry", "render_list", "table"]

LIST_HEADERS: Final = (
    "KIND",
    "NAME",
    "HELD",
    "WAITERS",
    "PARKED",
    "TASK/OWNER",
    "STATE",
    "TTL",
    "FENCE",
)
HOLDER_HEADERS: Final = ("TOKEN", "TASK/OWNER", "STATE", "TTL", "FENCE", "OWNER ID")
_NONE: Final = "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns separated by two spaces; trailing blanks trimmed."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=False)]
    lines = [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)).rstrip()
        for line in (headers, *rows)
    ]
    return "\n".join(lines)


def format_duration(seconds: float) -> str:
    """``12.3s``, ``4m05s`` or ``1h02m``: short, and exact enough for a TTL."""
    if seconds < 60:
        return f"{max(0.0, seconds):.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _who(holder: Holder) -> str:
    return holder.task_id or holder.owner or _NONE


def _held(entry: Entry) -> str:
    if entry.kind == "semaphore":
        limit = _NONE if entry.limit is None else str(entry.limit)
        return f"{len(entry.holders)}/{limit}"
    if not entry.holders:
        return "free"
    return "held" if len(entry.holders) == 1 else f"held x{len(entry.holders)}"


def _parked(entry: Entry) -> str:
    """``-`` (a lock), ``0``, or ``3 (oldest 12.0s)``; ``+N dead`` when dead-lettered."""
    if entry.kind != "semaphore":
        return _NONE
    text = str(entry.parked)
    if entry.parked and entry.oldest_parked is not None:
        text += f" (oldest {format_duration(entry.oldest_parked)})"
    return text + (f" +{entry.dead} dead" if entry.dead else "")


def _holder_cells(holder: Holder | None) -> list[str]:
    if holder is None:
        return [_NONE, _NONE, _NONE, _NONE]
    fence = _NONE if holder.fence is None else str(holder.fence)
    return [_who(holder), holder.state or _NONE, format_duration(holder.ttl), fence]


def render_list(entries: Sequence[Entry]) -> str:
    """The ``list`` table: one row per holder, the primitive's columns on its first."""
    rows: list[list[str]] = []
    for entry in entries:
        first = [entry.kind, entry.name, _held(entry), str(entry.waiters), _parked(entry)]
        holders: Sequence[Holder | None] = entry.holders or (None,)
        for i, holder in enumerate(holders):
            rows.append((first if i == 0 else [""] * len(first)) + _holder_cells(holder))
    return table(LIST_HEADERS, rows)


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def render_entry(
    entry: Entry,
    *,
    prefix: str,
    now: float | None = None,
    dead_letters: Sequence[tuple[str, float, str]] = (),
) -> str:
    """The ``inspect`` view of one primitive; ``now`` is the server's clock (seconds);
    ``dead_letters`` the newest parked runs that could not be decoded, as ``(id, epoch
    seconds, reason)``."""
    lines = [f"{entry.kind} {entry.name!r}"]

    def field(label: str, value: str) -> None:
        lines.append(f"  {label:<9} {value}")

    leases = f"{len(entry.holders)} lease{'' if len(entry.holders) == 1 else 's'}"
    waiters = f"{entry.waiters} waiter{'' if entry.waiters == 1 else 's'}"
    if entry.kind == "semaphore":
        limit = "an unknown limit" if entry.limit is None else f"limit {entry.limit}"
        available = "" if entry.available is None else f", {entry.available} available"
        field("held", f"{leases} of {limit}{available}; {waiters}")
        field("parked", _parked(entry) + " (runs queued in Redis for a permit)")
    else:
        field("held", f"{'yes' if entry.held else 'no'}, {leases}; {waiters}")
        owner = entry.holders[0] if entry.holders else None
        if owner is not None:
            detail = ""
            if owner.task_id and owner.task_id != owner.owner:
                detail = f"  (task {owner.task_id}, {owner.state or 'unknown state'})"
            field("owner", f"{owner.owner or '(none given)'}{detail}")
    if entry.since is not None:
        ago = f" ({format_duration(now - entry.since)} ago)" if now is not None else ""
        field("since", _utc(entry.since) + ago)
    if entry.fence is not None:
        field("fence", str(entry.fence))
    if entry.held:
        field("ttl", format_duration(entry.ttl) + " (longest lease, unless renewed)")
    field("prefix", prefix)
    if entry.holders:
        rows = [[h.token, *_holder_cells(h), h.owner or _NONE] for h in entry.holders]
        lines += ["", table(HOLDER_HEADERS, rows, indent="  ")]
    if dead_letters:
        rows = [[entry_id, _utc(at), reason] for entry_id, at, reason in dead_letters]
        lines += [
            "",
            "  dead letters (newest last):",
            table(("ID", "AT", "REASON"), rows, indent="  "),
        ]
    return "\n".join(lines)
