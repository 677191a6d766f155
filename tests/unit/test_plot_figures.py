"""benchmarks/plot_figures.py draws a figure from a benchmark's JSON (#28)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_bounded_json_becomes_a_png(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    runs = {
        "bounded": [{"start": 100.0, "intervals": [[100.1, 100.3], [100.2, 100.4]]}],
        "unbounded": [{"start": 200.0, "intervals": [[200.0, 200.1]]}],
    }
    (data / "bench_bounded.json").write_text(json.dumps(runs))
    (data / "unknown.json").write_text("{}")
    backlog = {
        "limit": 2,
        "seconds": 0.2,
        "modes": {
            "parked": [{"first": 10.0, "rows": [[0, 10.0, 10.0, 10.2], [1, 10.0, 10.0, 10.2]]}]
        },
    }
    (data / "bench_backlog.json").write_text(json.dumps(backlog))
    admissions = {
        "RedisRateLimiter, clocks in step": [[0.0, 0.1, 5.0], [0.2, 0.3, 5.5]],
        "limits moving window, clocks in step": [[0.0, 0.1, None]],
    }
    (data / "bench_ratelimit.json").write_text(
        json.dumps({"limit": 2, "period": 1.0, "admissions": admissions})
    )
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
    for name in ("bench_backlog", "bench_bounded", "bench_ratelimit"):
        assert (tmp_path / "img" / f"{name}.png").read_bytes().startswith(b"\x89PNG")


def test_the_sweep_counts_runs_at_once() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from plot_figures import concurrency_steps, surely_counts
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    times, counts = concurrency_steps(0.0, [[1.0, 3.0], [2.0, 4.0], [5.0, 6.0]])
    assert counts == [0, 1, 2, 1, 0, 1, 0]
    assert times == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # calls (start, end): the third ends at 1.0 with the first started at 0.0, not
    # after 0.0, so it is not surely in (0.0, 1.0]
    times, counts = surely_counts([(0.0, 0.1), (0.2, 0.5), (0.3, 1.0), (1.6, 1.7)], 1.0)
    assert times == [0.1, 0.5, 1.0, 1.7]
    assert counts == [1, 2, 2, 1]
