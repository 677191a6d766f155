"""The backlog case's table (``_backlog.py``): ours, the plain Celery controls, and the
differences between them (benchmark only)."""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

import _stages
from _common import print_table

OURS = ("parked", "parked in child", "parked+standby", "re-publish")
CONTROLS = ("plain c2", "plain c2 acks_late")  # plain Celery, concurrency = the limit
MODES = ("unbounded", *CONTROLS, *OURS)


def print_backlog(
    results: dict[str, list[dict[str, Any]]],
    count: int,
    seconds: float,
    limit: int,
    stamps: dict[str, dict[str, float]],
) -> None:
    """Print one row per run, the ours - plain differences and the stages (if stamped)."""
    ideal = count * seconds / limit
    plain = results.get("unbounded")
    plain_cpu = statistics.median(r["cpu"] for r in plain) if plain else None
    rows = []
    for label in MODES:
        for i, r in enumerate(results.get(label, ())):
            timed = label != "unbounded"  # served at the limit: a schedule to be late for
            extra = (
                "-"
                if plain_cpu is None or label not in OURS
                else f"{(r['cpu'] - plain_cpu) * count / max(1.0, count - limit) * 1000:.1f}"
            )
            rows.append(
                [
                    f"{label} #{i + 1}",
                    f"{r['drain']:.2f}",
                    f"{r['drain'] / ideal:.3f}" if timed else "-",
                    f"{r['publishes'] - 1:.2f}",
                    f"{r['publishes']:.2f}",
                    f"{r['cpu'] * 1000:.1f}",
                    extra,
                    f"{r['log lines']:.1f}",
                    int(r["peak"]),
                    f"{r['wait p50']:.2f}",
                    f"{r['wait p99']:.2f}",
                    f"{r['late p50'] * 1000:.0f} / {r['late p99'] * 1000:.0f} / "
                    f"{r['late max'] * 1000:.0f}"
                    if timed
                    else "-",
                    f"{r['replayed p50'] * 1000:.1f} / {r['replayed p99'] * 1000:.1f} / "
                    f"{r['replayed max'] * 1000:.0f}"
                    if timed
                    else "-",
                    f"{r['handoff p50'] * 1000:.1f} / {r['handoff p99'] * 1000:.1f}"
                    if timed
                    else "-",
                ]
            )
    print(
        f"backlog: {count} tasks of {seconds * 1000:g} ms sent at once, limit {limit}, "
        f"2 workers x 4 (prefork); ideal drain {ideal:.2f} s; unbounded = the same tasks "
        f"without a limit (all 8 slots); plain c2 (acks_late) = the same tasks as plain "
        f"Celery tasks on 1 worker x {limit} (-c {limit}, prefetch multiplier 1)\n"
    )
    print_table(
        [
            "run",
            "drain s",
            "/ ideal",
            "re-publishes/task",
            "deliveries/task",
            "worker CPU ms/task",
            "CPU ms/parked task",
            "log lines/task",
            "peak",
            "wait p50 s",
            "wait p99 s",
            "(a) late p50/p99/max ms vs nominal",
            "(b) late p50/p99/max ms vs replayed FIFO",
            "hand-off p50/p99 ms",
        ],
        rows,
    )
    print(
        "\n(a) start - (first send + (i // limit) x duration), run i sent i-th: "
        "cumulative, every hand-off's and every run's overhead adds up along the queue;\n"
        "(b) start - the moment the permit it gets under strict FIFO came free (the k-th "
        "run sent gets the k-th permit freed, from the runs' actual ends): per hand-off "
        "delay and queue order only."
    )
    _differences(results)
    for label in MODES:
        ids = set().union(*(r["ids"] for r in results.get(label, ())))
        table = _stages.report(stamps, ids) if stamps else []
        if table:
            print(f"\nhand-off stages, {label} (ms, over every run published by a release):")
            print_table(["stage", "what", "p50", "p99", "n"], table)
    print(
        f"\npython {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} / {os.getloadavg()[1]:.2f} / "
        f"{os.getloadavg()[2]:.2f}"
    )


def _differences(results: dict[str, list[dict[str, Any]]]) -> None:
    """Ours - plain: each mode's medians over the rounds of (a) p99 and drain, and ours
    minus each control's: how much of (a) a Celery-based design without us keeps too."""

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label]) * 1000

    controls = [c for c in CONTROLS if results.get(c)]
    if not controls:
        return
    rows = []
    for mode in (*controls, *(o for o in OURS if results.get(o))):
        rows.append(
            [
                mode,
                f"{med(mode, 'late p99'):.0f}",
                f"{med(mode, 'drain'):.0f}",
                *(
                    "-"
                    if mode in CONTROLS
                    else f"{med(mode, 'late p99') - med(c, 'late p99'):+.0f} / "
                    f"{med(mode, 'drain') - med(c, 'drain'):+.0f}"
                    for c in controls
                ),
            ]
        )
    print("\nours - plain (medians over the rounds, ms):")
    print_table(
        ["mode", "(a) late p99", "drain", *(f"ours - {c}: (a) p99 / drain" for c in controls)], rows
    )
