"""Concurrency of recorded runs: an interval sweep, lanes, and a terminal timeline.

Everything here is a pure function of :class:`~.records.Run` values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .records import Run

__all__ = ["Glyphs", "draw", "lanes", "max_at_once", "overlapping_pairs"]


def max_at_once(runs: Iterable[Run]) -> int:
    """The most runs in progress at one instant (an interval sweep).

    A run that ends at the very instant another starts does not overlap it.
    """
    events = sorted(
        [(run.start, 1) for run in runs] + [(run.end, -1) for run in runs]
    )  # at equal times -1 sorts first: the end before the start
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def overlapping_pairs(runs: Iterable[Run]) -> int:
    """How many pairs of runs overlap in time (0 for a true singleton)."""
    ordered = sorted(runs, key=lambda run: run.start)
    pairs = 0
    for i, run in enumerate(ordered):
        for later in ordered[i + 1 :]:
            if later.start >= run.end:
                break
            pairs += 1
    return pairs


def lanes(runs: Iterable[Run]) -> list[list[Run]]:
    """Runs packed into the fewest rows in which none overlaps another.

    Greedy by start time, which is optimal for intervals: a subject needs as many
    lanes as it ever had runs at once -- one for a singleton.
    """
    rows: list[list[Run]] = []
    for run in sorted(runs, key=lambda run: run.start):
        row = next((row for row in rows if row[-1].end <= run.start), None)
        if row is None:
            rows.append([run])
        else:
            row.append(run)
    return rows


@dataclass(frozen=True)
class Glyphs:
    """The characters of the timeline: Unicode, or plain ASCII."""

    bar: str
    tick: str

    @classmethod
    def for_encoding(cls, encoding: str | None, ascii_only: bool = False) -> Glyphs:
        """Unicode when the output encoding can show it, else ASCII."""
        unicode, ascii = cls(bar="━", tick="┊"), cls(bar="=", tick="|")
        try:
            (unicode.bar + unicode.tick).encode(encoding or "ascii")
        except (UnicodeEncodeError, LookupError):
            return ascii
        return ascii if ascii_only else unicode


def _ruler(scale: float, width: int, tick: str) -> tuple[str, str]:
    """Labels (``0s 2s 4s``) and tick marks, every 1, 2, 5, 10... seconds."""
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1e9) if s / scale >= 6)
    labels, ticks = [" "] * width, [" "] * width
    second = 0.0
    while (column := round(second / scale)) < width:
        text = f"{second:g}s"
        labels[column : column + len(text)] = text
        ticks[column] = tick
        second += step
    return "".join(labels)[:width], "".join(ticks)


def _row(
    runs: Sequence[Run],
    t0: float,
    scale: float,
    width: int,
    glyphs: Glyphs,
    letters: dict[str, str],
) -> str:
    cells = [" "] * width
    for run in runs:
        first = min(width - 1, int((run.start - t0) / scale))
        last = min(width, max(first + 1, math.ceil((run.end - t0) / scale)))
        cells[first:last] = letters[run.node] + glyphs.bar * (last - first - 1)
    return "".join(cells)


def _at_once_row(runs: Sequence[Run], t0: float, scale: float, width: int) -> str:
    """Per column, the most runs in progress at any instant of that column."""
    cells = []
    for column in range(width):
        c0, c1 = t0 + column * scale, t0 + (column + 1) * scale
        # The maximum over [c0, c1) is reached at c0 or right after a start inside it.
        instants = [c0] + [run.start for run in runs if c0 < run.start < c1]
        most = max(sum(1 for run in runs if run.start <= t < run.end) for t in instants)
        cells.append(str(most) if most else " ")
    return "".join(cells)


def draw(
    groups: Sequence[tuple[str, Sequence[Run], bool]],
    *,
    width: int,
    glyphs: Glyphs,
    t0: float | None = None,
    label_width: int = 22,
) -> list[str]:
    """The timeline, one row per lane of each subject, as lines of text at most
    ``width`` characters wide (the bars get 40 to 100 columns); its ``0s`` is ``t0``
    (the runs' clock; default: the first run's start).

    ``groups`` are ``(subject, runs, show_at_once)``: a subject whose runs overlap
    takes several rows (a singleton takes exactly one); with ``show_at_once`` a row
    of digits follows, the most runs in progress during each column. Each run is a
    bar starting with the letter of its worker (``a`` for ``worker-a``).
    """
    width = max(40, min(width - label_width, 100))  # columns for the bars
    every = [run for _, runs, _ in groups for run in runs]
    if not every:
        return ["(no runs recorded)"]
    first = min(run.start for run in every)
    t0 = first if t0 is None else min(t0, first)  # no bar starts left of the ruler
    span = max(run.end for run in every) - t0
    scale = max(span / width, 1e-3)
    letters = {node: node.rsplit("-", 1)[-1][:1] or "?" for node in {r.node for r in every}}
    pad = " " * label_width
    labels, ticks = _ruler(scale, width, glyphs.tick)
    lines = [pad + labels.rstrip(), pad + ticks.rstrip()]
    for subject, runs, show_at_once in groups:
        rows = lanes(runs)
        for i, row in enumerate(rows or [[]]):
            name = subject if len(rows) <= 1 else f"{subject} #{i + 1}"
            bar = _row(row, t0, scale, width, glyphs, letters)
            lines.append(f"{name:<{label_width}}{bar}".rstrip())
        if show_at_once:
            counts = _at_once_row(runs, t0, scale, width)
            lines.append(f"{'  at once':<{label_width}}{counts}".rstrip())
    legend = ", ".join(f"{letter} = {node}" for node, letter in sorted(letters.items()))
    lines.append(f"{pad}1 column = {scale:.2f}s; a bar is one run and starts with the")
    lines.append(f"{pad}letter of its worker: {legend}")
    return lines
