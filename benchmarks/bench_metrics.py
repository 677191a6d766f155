"""The hot-path cost of counting (#27): ``bench_singleton`` with ``redislock_metrics``
off and on, in turn, in one run.

Run from the repository root::

    python benchmarks/bench_metrics.py --calls 200 --rounds 2

Each round runs ``bench_singleton.run`` (its own redis-server and in-process worker)
once with counting off and once on, alternating which goes first; the singleton's
p50 and its ratio to the plain task's p50 (same run, so the machine's drift cancels)
are the figures to compare. For the cost before this package counted anything at
all, run ``benchmarks/bench_singleton.py`` from a checkout without it beside this.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_singleton
from _common import parse_args

_make_app = bench_singleton.make_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    args = parse_args(parser)
    for i in range(args.rounds):
        for on in (False, True) if i % 2 == 0 else (True, False):

            def make_app(base: str, on: bool = on) -> Any:
                app = _make_app(base)
                app.conf.redislock_metrics = on
                return app

            bench_singleton.make_app = make_app
            print(f"\n=== round {i + 1}: redislock_metrics = {on} ===")
            bench_singleton.run(args.calls, args.pool)


if __name__ == "__main__":
    main()
