"""Counts exact under prefork (#27), the full run: 4 workers x 4 processes, 2,000
singleton and bounded tasks with duplicates and SIGKILLed pool processes, then 500
rate-limited tasks at 250/s (about half parked for their admission).

Run from the repository root (a minute or two)::

    python benchmarks/bench_metrics_exact.py
    python benchmarks/bench_metrics_exact.py --workers 2 --processes 2 --tasks 200

The scenario is ``tests/integration/metrics/scenario.py`` (its short version is
``test_prefork.py``): it records at enqueue which calls were granted their lock or
refused as duplicates, in the bodies which runs started and ended, which runs it
killed and which were parked (for a permit, for the rate), then compares every
counter the workers added to Redis with that record.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from benchmarks._common import parse_args  # noqa: E402
from celery_redislock.testing import RedisServer  # noqa: E402
from tests.integration.metrics import scenario  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--kills", type=int, default=10, help="runs of each kind killed")
    args = parse_args(parser)
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        outcome = scenario.run(
            Path(tmp),
            server.url,
            workers=args.workers,
            processes=args.processes,
            tasks=args.tasks,
            kills=args.kills,
        )
    print(
        f"{args.workers} workers x {args.processes} processes, {args.tasks} tasks, "
        f"{outcome.killed} pool processes SIGKILLed, {outcome.seconds:.1f}s\n"
    )
    ok = True
    for key, want in sorted(outcome.expected.items()):
        got = outcome.counted.get(key, 0)
        ok = ok and got == want
        kind, name, what = key
        print(
            f"  {kind:9} {name.rsplit('.', 1)[-1]:8} {what:18} recorded {want:5}  counted {got:5}"
        )
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().strip()
    print(f"\n{'every counter exact' if ok else 'MISMATCH'}; /proc/loadavg: {load}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
