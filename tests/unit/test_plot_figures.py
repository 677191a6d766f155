"""benchmarks/plot_figures.py draws each figure from a benchmark's JSON (#28)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DUMPS: dict[str, Any] = {
    "bench_bounded": {
        "bounded": [{"start": 100.0, "intervals": [[100.1, 100.3], [100.2, 100.4]]}],
        "unbounded": [{"start": 200.0, "intervals": [[200.0, 200.1]]}],
    },
    "bench_ratelimit": {
        "limit": 2,
        "period": 1.0,
        "admissions": {
            "RedisRateLimiter, clocks in step": [[0.0, 0.1, 5.0], [0.2, 0.3, 5.5]],
            "limits moving window, clocks in step": [[0.0, 0.1, None]],
        },
    },
    "bench_backlog": {
        "limit": 2,
        "seconds": 0.2,
        "modes": {"parked": [{"first": 10.0, "rows": [[0, 10, 10, 10.2], [1, 10, 10, 10.2]]}]},
    },
    "bench_lock": {"unit": "s", "uncontended": {"floor": [2e-4, 3e-4], "RedisLock": [3e-4]}},
    "bench_beat": {
        "redbeat_wait": 60.0,
        "failovers": {
            "LeaderScheduler, lease 10 s": [
                {
                    "killed_at": 1e9,
                    "took": 11.2,
                    "runs": [[-1.0, True], [-0.1, True], [11.2, False]],
                }
            ],
            "RedBeat, default settings": [{"killed_at": 1e9, "took": None, "runs": [[-0.5, None]]}],
        },
        # what benchmarks/_common.py's --dump adds beside a script's own series
        "meta": {
            "command": "python benchmarks/bench_beat.py --dump x.json",
            "started": "2026-11-28 23:40 UTC",
            "ended": "2026-11-28 23:45 UTC",
            "load_average": {"start": [4.1, 4.0, 3.0], "end": [5.2, 4.4, 3.1]},
            "machine": {
                "cpu": "AMD EPYC",
                "cpus": 2,
                "memory_gb": 23,
                "system": "Linux",
                "python": "3.11.7",
                "redis": "Redis server v=7.0.15",
            },
        },
        "tables": [{"heading": "Failover", "headers": ["scheduler"], "rows": [["x"]]}],
        "printed": "...",
    },
}


def test_each_dump_becomes_a_png(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name, dump in DUMPS.items():
        (data / f"{name}.json").write_text(json.dumps(dump))
    (data / "unknown.json").write_text("{}")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plot_figures.py"),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "img"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "unknown.json: no plotter, skipped" in result.stdout
    for name in DUMPS:
        assert (tmp_path / "img" / f"{name}.png").read_bytes().startswith(b"\x89PNG")


def test_the_sweeps_count() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from plot_figures import concurrency_steps, surely_counts
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    times, counts = concurrency_steps(0.0, [[1.0, 3.0], [2.0, 4.0], [5.0, 6.0]])
    assert counts == [0, 1, 2, 1, 0, 1, 0]
    assert times == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # calls (start, end): the third ends at 1.0 with the first started at 0.0, not
    # after 0.0, so the first is not surely in (0.0, 1.0]
    times, counts = surely_counts([(0.0, 0.1), (0.2, 0.5), (0.3, 1.0), (1.6, 1.7)], 1.0)
    assert times == [0.1, 0.5, 1.0, 1.7]
    assert counts == [1, 2, 2, 1]


def test_every_benchmark_takes_dump() -> None:
    """Each script parses its options through benchmarks/_common.py's parse_args, which
    adds --dump (its results as JSON beside its table)."""
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    assert len(scripts) >= 15
    without = [
        p.name
        for p in scripts
        if "parse_args(parser)" not in p.read_text() or "parser.parse_args()" in p.read_text()
    ]
    assert not without, without


def test_a_dump_holds_the_table_the_machine_and_the_date(tmp_path: Path) -> None:
    dump = tmp_path / "journal.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_journal.py"),
            "--runs",
            "20",
            "--rounds",
            "1",
            "--dump",
            str(dump),
        ],
        cwd=ROOT,  # the command is recorded relative to it
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(dump.read_text())
    assert data["printed"] == result.stdout
    [table] = data["tables"]
    assert table["headers"] == ["per parked run", "client CPU µs", "wall µs"]
    names = [row[0] for row in table["rows"]]
    assert names == ["park + take", "with the journal", "journal's cost"]
    assert all(row[1] in result.stdout for row in table["rows"])
    meta = data["meta"]
    assert meta["command"].startswith("python benchmarks/bench_journal.py --runs 20")
    assert meta["machine"]["cpus"] == os.cpu_count()
    assert meta["machine"]["redis"].startswith("Redis server v=")
    assert meta["started"].endswith(" UTC") and len(meta["load_average"]["end"]) == 3


def test_every_figure_of_the_benchmarks_page_comes_from_a_dump() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from plot_figures import PLOTTERS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(img/(\w+)\.png\)", page)
    assert "bench_beat" in figures  # the failover timeline
    for name in figures:
        assert name in PLOTTERS, name
        assert (ROOT / "docs" / "benchmarks" / f"{name}.json").exists(), name
        assert (ROOT / "docs" / "img" / f"{name}.png").exists(), name
        assert f"docs/benchmarks/{name}.json" in page, f"{name}: the page names no command"
