"""benchmarks/plot_figures.py draws each figure from a benchmark's JSON (#28)."""

from __future__ import annotations

import json
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
