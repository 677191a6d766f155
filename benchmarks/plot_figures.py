"""Turn the benchmarks' JSON results into the figures of the documentation (#28).

    pip install -e ".[plots]"
    python benchmarks/bench_bounded.py --tasks 100 --duration 0.05 --rounds 2 \\
        --dump docs/benchmarks/bench_bounded.json
    python benchmarks/bench_bounded.py --backlog --modes "plain c2 acks_late,parked,re-publish" \\
        --rounds 1 --dump docs/benchmarks/bench_backlog.json
    python benchmarks/bench_ratelimit.py --dump docs/benchmarks/bench_ratelimit.json
    python benchmarks/bench_lock.py --dump docs/benchmarks/bench_lock.json
    python benchmarks/bench_beat.py --scenario 0 --control 0 --kills 3 --lease 3 \\
        --redbeat-kills 1 --redbeat-wait 60 --inner persistent \\
        --dump docs/benchmarks/bench_beat.json
    python benchmarks/plot_figures.py          # docs/benchmarks/*.json -> docs/img/*.png

Each figure is drawn from a JSON file a benchmark wrote (``--dump``, which every
script takes: benchmarks/_common.py); nothing is typed in by hand. A dump's "meta" --
the date, the machine, the load -- is printed along the figure's bottom edge. A JSON
file without a plotter here is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines
import matplotlib.pyplot as plt
from _common import META_KEYS
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]


def concurrency_steps(start: float, intervals: list[list[float]]) -> tuple[list[float], list[int]]:
    """Runs in progress over time (an interval sweep), seconds from ``start``."""
    events = sorted(
        [(s - start, 1) for s, _ in intervals] + [(e - start, -1) for _, e in intervals]
    )
    times, counts, inside = [0.0], [0], 0
    for at, step in events:
        inside += step
        times.append(at)
        counts.append(inside)
    return times, counts


def plot_bench_bounded(data: dict[str, Any]) -> Figure:
    """bench_bounded.py --dump: runs at once over time, bounded against unbounded."""
    fig, grid = plt.subplots(len(data), 1, figsize=(8, 2.2 * len(data)), sharex=True, squeeze=False)
    axes = list(grid[:, 0])
    for ax, (label, runs) in zip(axes, sorted(data.items()), strict=True):
        for i, run in enumerate(runs):
            times, counts = concurrency_steps(run["start"], run["intervals"])
            ax.step(times, counts, where="post", label=f"round {i + 1}", linewidth=1)
        peak = max(max(concurrency_steps(r["start"], r["intervals"])[1]) for r in runs)
        ax.set_title(f"{label}: {len(runs[0]['intervals'])} tasks, peak {peak} at once")
        ax.set_ylabel("runs at once")
        ax.legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("seconds since the first send")
    return fig


def surely_counts(calls: list[tuple[float, float]], period: float) -> tuple[list[float], list[int]]:
    """At the end of each admitting call, how many admissions surely fell in the period
    ending there: those whose calls both started and ended inside it (a lower bound,
    the same for every limiter: bench_ratelimit.py's "client" column)."""
    calls = sorted(calls, key=lambda call: call[1])
    first = min((start for start, _ in calls), default=0.0)
    times, counts = [], []
    for _, end in calls:
        times.append(end - first)
        counts.append(sum(1 for s, e in calls if e <= end and s > end - period))
    return times, counts


def plot_bench_ratelimit(data: dict[str, Any]) -> Figure:
    """bench_ratelimit.py --dump: admissions surely in the last period, ours against
    limits', with the processes' clocks in step and an hour apart."""
    limit, period = data["limit"], data["period"]
    scenarios: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for label, rows in data["admissions"].items():
        limiter, clocks = label.split(", ", 1)
        scenarios.setdefault(clocks, {})[limiter] = [(start, end) for start, end, _ in rows]
    fig, grid = plt.subplots(
        1, len(scenarios), figsize=(5 * len(scenarios), 3), sharey=True, squeeze=False
    )
    axes = list(grid[0])
    for ax, (clocks, limiters) in zip(axes, sorted(scenarios.items()), strict=True):
        for limiter, calls in sorted(limiters.items()):
            xs, ys = surely_counts(calls, period)
            ax.step(xs, ys, where="post", label=limiter, linewidth=1)
        ax.axhline(limit, color="grey", linestyle="--", linewidth=0.8, label=f"N = {limit}")
        ax.set_title(clocks)
        ax.set_xlabel("seconds since the first call")
        ax.legend(loc="lower right", fontsize="small")
    axes[0].set_ylabel(f"admissions surely in the last {period:g} s")
    return fig


def plot_bench_backlog(data: dict[str, Any]) -> Figure:
    """bench_bounded.py --backlog --dump: runs ended over time, each mode's first round,
    against the ideal drain of ``limit`` runs every ``seconds``."""
    limit, seconds = data["limit"], data["seconds"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    count = 0
    for mode, runs in data["modes"].items():
        run = runs[0]
        ends = sorted(end - run["first"] for _, _, _, end in run["rows"])
        count = len(ends)
        ax.step([0.0, *ends], range(count + 1), where="post", label=mode, linewidth=1.2)
    ideal_t = [k * seconds for k in range(count // limit + 1)]
    ax.step(
        ideal_t,
        [min(count, k * limit) for k in range(len(ideal_t))],
        where="post",
        color="grey",
        linestyle="--",
        linewidth=0.8,
        label=f"ideal: {limit} every {seconds:g} s",
    )
    ax.set_xlabel("seconds since the first send")
    ax.set_ylabel("runs ended")
    ax.set_title(f"a backlog of {count} tasks of {seconds:g} s, limit {limit}")
    ax.legend(loc="lower right", fontsize="small")
    return fig


def plot_bench_lock(data: dict[str, Any]) -> Figure:
    """bench_lock.py --dump: the distribution of one uncontended acquire + release, ours
    against the floor (the same commands sent bare) and redis-py's ``Lock``."""
    scale = 1e6 if data["unit"] == "s" else 1.0
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for name, samples in data["uncontended"].items():
        xs = sorted(t * scale for t in samples)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("one acquire + release (µs, log scale)")
    ax.set_ylabel("share of cycles at most this long")
    ax.set_title("uncontended lock: the distribution of a cycle")
    ax.legend(loc="lower right", fontsize="small")
    return fig


def plot_bench_beat(data: dict[str, Any]) -> Figure:
    """bench_beat.py --dump: failover timelines. One row per SIGKILL of the leading
    beat: the runs of the 1 s entry around it, by the killed beat and by the one that
    took over, and the gap between (kill -> first run sent by another beat)."""
    groups: dict[str, list[dict[str, Any]]] = data["failovers"]
    rows = sum(len(kills) for kills in groups.values())
    fig, grid = plt.subplots(
        len(groups),
        1,
        figsize=(8, 1.2 * len(groups) + 0.35 * rows),
        sharex=True,
        squeeze=False,
        height_ratios=[len(kills) + 1 for kills in groups.values()],
    )
    axes = list(grid[:, 0])
    senders = {True: ("tab:blue", "the killed leader"), False: ("tab:orange", "another beat")}
    senders_unknown = ("tab:grey", "a beat (not stamped)")
    for ax, (label, kills) in zip(axes, groups.items(), strict=True):
        for y, kill in enumerate(kills, start=1):
            for sent_by_killed, (color, _) in [*senders.items(), (None, senders_unknown)]:
                xs = [t for t, by in kill["runs"] if by is sent_by_killed]
                ax.scatter(xs, [y] * len(xs), color=color, marker="|", s=120, linewidths=1.5)
            took = kill["took"]
            end = data["redbeat_wait"] if took is None else took
            ax.plot([0, end], [y, y], color="red", linewidth=0.8, alpha=0.6)
            ax.plot([0], [y], color="red", marker="x")
            ax.annotate(
                f"{took:.1f} s" if took is not None else f"no takeover within {end:g} s",
                (end, y),
                xytext=(4, 3) if took is not None else (-4, 3),
                textcoords="offset points",
                ha="left" if took is not None else "right",
                va="bottom",
                fontsize="small",
            )
        took_all = sorted(k["took"] for k in kills if k["took"] is not None)
        summary = f"median takeover {took_all[len(took_all) // 2]:.1f} s" if took_all else ""
        ax.set_title(f"{label}: {len(kills)} kill{'s' * (len(kills) > 1)}; {summary}".rstrip("; "))
        ax.set_yticks(range(1, len(kills) + 1), [f"kill {y}" for y in range(1, len(kills) + 1)])
        ax.set_ylim(0.4, len(kills) + 0.6)
        ax.invert_yaxis()
    handles = [
        plt.Line2D([], [], color=color, marker="|", linestyle="", markersize=10, label=what)
        for color, what in [*senders.values(), senders_unknown]
    ]
    handles.append(plt.Line2D([], [], color="red", marker="x", label="SIGKILL -> takeover"))
    axes[0].legend(handles=handles, loc="upper right", fontsize="x-small", ncol=2)
    axes[-1].set_xlabel("seconds since the leading beat's SIGKILL (runs of the 1 s entry)")
    return fig


def stamp(fig: Figure, meta: dict[str, Any]) -> None:
    """The date, machine and load of the run (a dump's "meta"), along the bottom."""
    machine = meta["machine"]
    load = meta["load_average"]
    fig.text(
        0.005,
        0.005,
        f"{meta['started']}; {machine['cpus']} x {machine['cpu']}, {machine['memory_gb']} GB, "
        f"Python {machine['python']}, {machine['redis']}; load average "
        f"{load['start'][0]:g} at start, {load['end'][0]:g} at end",
        fontsize="x-small",
        color="grey",
    )


PLOTTERS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "bench_backlog": plot_bench_backlog,
    "bench_beat": plot_bench_beat,
    "bench_bounded": plot_bench_bounded,
    "bench_lock": plot_bench_lock,
    "bench_ratelimit": plot_bench_ratelimit,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for source in sorted(args.data.glob("*.json")):
        plotter = PLOTTERS.get(source.stem)
        if plotter is None:
            print(f"{source.name}: no plotter, skipped")
            continue
        target = args.out / f"{source.stem}.png"
        data = json.loads(source.read_text())
        fig = plotter({k: v for k, v in data.items() if k not in META_KEYS})
        if "meta" in data:  # dumps older than benchmarks/_common.py's parse_args have none
            stamp(fig, data["meta"])
            fig.tight_layout(rect=(0, 0.03, 1, 1))
        else:
            fig.tight_layout()
        fig.savefig(target, dpi=100)
        plt.close(fig)
        print(f"{source.name} -> {target}")


if __name__ == "__main__":
    main()
