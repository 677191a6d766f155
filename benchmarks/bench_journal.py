"""Benchmark the park journal's cost per parked run (client CPU and wall time).

Run from the repository root (a few seconds)::

    python benchmarks/bench_journal.py                 # 2000 parked runs per round, 5 rounds

Starts two private ``redis-server`` processes: the lock Redis and a second one standing
for the broker's Redis. One parked run's Redis work, as the package does it, is
``park`` (``park.lua``) when it is refused and ``take`` (``park_take.lua``) when it
starts; with the journal, also ``ParkJournal.put`` before the park and
``ParkJournal.drop`` before the take (one script call each, on the other server).
Both variants run interleaved in each round (same machine state); reported: client
CPU (``time.process_time``) and wall time per parked run, and the journal's share.
The payload is a ~600-byte message, like a small task's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _common import median, parse_args, print_table, us

from celery_redislock.core.journal import ParkJournal
from celery_redislock.core.parking import ParkingSemaphore, new_entry_id
from celery_redislock.testing import RedisServer

PAYLOAD = b"RLP1 application/json utf-8\n" + b'{"task": "x", "args": [1]}' + b" " * 560


def one_batch(sem: ParkingSemaphore, journal: ParkJournal | None, n: int) -> tuple[float, float]:
    """Park and take ``n`` runs; (CPU seconds, wall seconds) per run."""
    ids = [new_entry_id() for _ in range(n)]
    cpu, wall = time.process_time(), time.perf_counter()
    for entry_id in ids:
        if journal is not None:
            journal.put(entry_id, PAYLOAD, 86400.0)
        sem.park(entry_id, PAYLOAD, owner="task-id")
    for entry_id in ids:
        if journal is not None:
            journal.drop(entry_id)
        sem.take(entry_id, "owner")
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="parked runs per batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parse_args(parser)
    with RedisServer() as locks_server, RedisServer() as broker_server:
        locks = redis.Redis(port=locks_server.port)
        journal = ParkJournal(redis.Redis(port=broker_server.port), "bench")
        sem = ParkingSemaphore(locks, "api", limit=1, prefix="bench")
        assert sem.acquire(blocking=False) is not None  # the pool is full: runs park
        one_batch(sem, journal, 200)  # warm up: scripts loaded, connections made
        plain: list[tuple[float, float]] = []
        journaled: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            plain.append(one_batch(sem, None, args.runs))
            journaled.append(one_batch(sem, journal, args.runs))
        rows = []
        for name, results in (("park + take", plain), ("with the journal", journaled)):
            rows.append(
                [name, us(median([c for c, _ in results])), us(median([w for _, w in results]))]
            )
        extra_cpu = median([c for c, _ in journaled]) - median([c for c, _ in plain])
        extra_wall = median([w for _, w in journaled]) - median([w for _, w in plain])
        rows.append(["journal's cost", us(extra_cpu), us(extra_wall)])
        print_table(["per parked run", "client CPU µs", "wall µs"], rows)
        print(f"journal left behind: {len(journal)} entries; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
