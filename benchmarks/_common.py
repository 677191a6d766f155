"""Small helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) of ``values``, nearest-rank; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    """Median of ``values``; nan when empty."""
    return statistics.median(values) if values else float("nan")


def us(seconds: float) -> str:
    """Seconds as microseconds with one decimal, e.g. ``'412.3'``."""
    return f"{seconds * 1e6:.1f}"


def command_calls(client: Any) -> int:
    """Total commands the server ran (INFO commandstats, including those run by Lua)."""
    return sum(int(stat["calls"]) for stat in client.info("commandstats").values())


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain-text table with right-aligned columns (first column left)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest])

    print(line(cells[0]))
    print("  ".join("-" * width for width in widths))
    for row in cells[1:]:
        print(line(row))
