"""Small helpers shared by the benchmark scripts (not part of the package).

Every script parses its options with :func:`parse_args`, which adds ``--dump FILE``:
the results as JSON beside the printed table (#28) -- each table :func:`print_table`
printed (headers and cells), everything the script printed, the script's own series
(:func:`add_to_dump`, for ``benchmarks/plot_figures.py``), and under ``"meta"`` the
command, the machine and the dates with the load average at both ends.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import io
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TextIO

from celery_redislock.errors import ConfigurationError
from celery_redislock.testing import find_redis_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository: the workers import the package from it (this copy, not another)."""

# Keys of a dump that are not a script's own series (plot_figures.py skips them).
META_KEYS = ("meta", "tables", "printed")

_started = time.time()
_load_at_start = os.getloadavg()
_tables: list[dict[str, Any]] = []
_series: dict[str, Any] = {}
_printed = io.StringIO()
_failed = False


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
    """Print a plain-text table with right-aligned columns (first column left); kept for
    ``--dump`` under the last ``#`` heading printed before it."""
    headings = [line for line in _printed.getvalue().splitlines() if line.startswith("#")]
    _tables.append(
        {
            "heading": headings[-1].lstrip("# ") if headings else None,
            "headers": [str(h) for h in headers],
            "rows": [[_cell(c) for c in row] for row in rows],
        }
    )
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


def _cell(value: object) -> object:
    """A table cell as JSON has it: numbers as numbers (nan as None), the rest as text."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return None if value != value else value  # nan
    return str(value)


def add_to_dump(**series: Any) -> None:
    """Add the script's own results (JSON-able) to its ``--dump``: the figures' input."""
    _series.update(series)


def machine() -> dict[str, Any]:
    """What ran the benchmark: CPU, cores, memory, system, Python, redis-server."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or platform.machine(),
    )
    memory = next(
        (
            int(line.split()[1]) // 1024**2
            for line in _read("/proc/meminfo").splitlines()
            if line.startswith("MemTotal:")
        ),
        None,
    )
    try:
        redis = (
            subprocess.run(
                [find_redis_server(), "--version"], capture_output=True, text=True, timeout=10
            )
            .stdout.split(" sha=")[0]
            .strip()
        )
    except (ConfigurationError, OSError, subprocess.SubprocessError) as e:
        redis = f"unknown ({e})"
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gb": memory,
        "system": platform.platform(),
        "python": platform.python_version(),
        "redis": redis,
    }


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


class _Tee(io.TextIOBase):
    """stdout that also keeps what was printed, for the dump."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> int:
        _printed.write(text)
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """``parser.parse_args()`` with ``--dump FILE`` added: when given, the results are
    written there as JSON once the script ends (not when it fails)."""
    parser.add_argument(
        "--dump",
        metavar="FILE",
        help="also write the results (tables, output, series, machine, date) to this JSON file",
    )
    options = parser.parse_args()
    if options.dump:
        sys.stdout = _Tee(sys.stdout)
        previous = sys.excepthook

        def failed(
            kind: type[BaseException], value: BaseException, tb: TracebackType | None
        ) -> None:
            global _failed
            _failed = True
            previous(kind, value, tb)

        sys.excepthook = failed
        atexit.register(_write, options.dump, sys.argv[:])
    return options


def _write(path: str, argv: list[str]) -> None:
    if _failed:
        print(f"--dump: not written, the script failed ({path})", file=sys.stderr)
        return
    sys.stdout.flush()
    meta = {
        "command": " ".join(["python", os.path.relpath(argv[0]), *argv[1:]]),
        "started": _utc(_started),
        "ended": _utc(time.time()),
        "load_average": {
            "start": [round(x, 2) for x in _load_at_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
        "machine": machine(),
    }
    payload = {"meta": meta, "tables": _tables, "printed": _printed.getvalue(), **_series}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, ensure_ascii=False)
        f.write("\n")


def _utc(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def peak(intervals: Iterable[Sequence[Any]]) -> int:
    """Most intervals ``(start, end, ...)`` open at one instant (an end at t closes
    before a start at t)."""
    spans = [(float(span[0]), float(span[1])) for span in intervals]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    current = best = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def start_worker(
    directory: str,
    module: str,
    name: str,
    log_path: str,
    *options: str,
    concurrency: int = 4,
) -> subprocess.Popen[bytes]:
    """A ``celery -A <module>:app worker`` subprocess (prefork, ``concurrency``
    processes, node ``<name>-<random>@%h``) importing from ``directory`` and
    :data:`ROOT`, in a session of its own (see :func:`stop_workers`), its output
    appended to ``log_path``. ``options``: more ``celery worker`` options, e.g.
    ``"-Q", "queue"``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [directory, ROOT, os.environ.get("PYTHONPATH")])
        ),
    }
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        f"{module}:app",
        "worker",
        "-P",
        "prefork",
        "-c",
        str(concurrency),
        "-n",
        f"{name}-{uuid.uuid4().hex[:6]}@%h",
        "-l",
        "info",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        *options,
    ]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            args,
            cwd=directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_workers(
    workers: Sequence[subprocess.Popen[bytes]], groups: Iterable[subprocess.Popen[bytes]] = ()
) -> None:
    """Stop ``workers`` (SIGTERM, SIGKILL after 10 s), then SIGKILL the process group
    of each of them and of ``groups`` (workers killed earlier): a pool child orphaned
    by a killed main process is ended too."""
    for process in workers:
        process.terminate()
    for process in workers:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    for process in [*workers, *groups]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
