"""Worker kills: bounded (parked) tasks lost beside plain Celery tasks, in one run.

Run from the repository root (about a minute per round and settings)::

    python benchmarks/bench_worker_kill.py                 # 3 rounds of 300 + 300, limit 3
    python benchmarks/bench_worker_kill.py --journal --keep  # broker on its own Redis
    # #24's scenario: Celery configured for redelivery, beside today's settings
    python benchmarks/bench_worker_kill.py --settings redelivery,today --duration 0.3 \
        --lock-ttl 3 --interval 4 --rounds 5 --seed 1

``--settings``: ``today`` (Celery's defaults: the ack at the start, prefetch 4, the
Redis broker's hour-long ``visibility_timeout``) and/or ``redelivery`` -- what an
operator who asks for at-least-once delivery configures (#24): ``task_acks_late``,
``worker_prefetch_multiplier=1``, ``visibility_timeout`` 10 s and
``unacked_restore_interval`` 1 s (``unacked_restore_throttle`` 1), so a message
whose worker died is handed out again; both kinds run under the same settings.

A private ``redis-server`` holds the broker, results and locks (``--journal``: the
broker and results on a second one, so parked runs are journaled there). 4 ``celery
worker`` subprocesses (prefork, 4 processes each, default prefetch) consume the default
queue, which carries both kinds:

* **bounded**: ``@bounded_task(concurrency_limit=3)`` (parking, the default), all sent
  at once: most are parked in Redis and published again one by one;
* **plain**: the same body as a plain Celery task, sent at a steady rate over the same
  time, so the kills meet both alike.

Every ``--interval`` seconds (5) a random worker's **main process** is SIGKILLed (its
pool children die with it: Celery sets their parent-death signal) and a fresh worker
takes its place. Every run appends ``"<start> <end> <task id>"`` to a file, and every
process of the app its events (:mod:`_kills`). When everything that can still run has
run (nothing new for ``lock_ttl`` + 5 s), the table shows per round and kind: tasks
sent, ran, lost (never ran), ran twice, the peak concurrency of the bounded runs
(interval sweep: must be <= the limit), messages per task (each is exposed to the
kills), tasks in a killed main at its kill and how many of those ran all the same, the
permits and parked entries left in Redis (must be 0), and where each lost task was
lost: its last message the original (``orig``: plain Celery loses it alike) or a
re-publish (``repub``); ``transit`` (taken off the list by a main killed before it
recorded it), ``main`` (in a killed main's prefetch), ``running`` (its pool process
killed with its main: lost bounded or not), ``waiting`` (a bounded run started
without a permit, waiting in place: ``--standby``), ``parked``. A ``repub`` loss
other than ``running`` is parking's own (a lost re-publish is published again when its
reserved permit lapses): the last line counts them, and must say 0.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis
from _common import parse_args, peak, print_table, start_worker, stop_workers
from _kills import HOOKS, read_events, summary

from celery_redislock.core.parking import ParkingSemaphore
from celery_redislock.testing import RedisServer

APP = """
import time
from celery import Celery
from celery_redislock import bounded_task

app = Celery("bench_kill", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False)
app.conf.update({conf})


def _body(kind, seconds):
    start = time.time()
    time.sleep(seconds)
    from celery import current_task
    with open({records!r} + "." + kind, "a") as out:
        out.write(f"{{start}} {{time.time()}} {{current_task.request.id}}\\n")


@bounded_task(app=app, name="kill.bounded", concurrency_limit={limit}, concurrency_key="kill",
              concurrency_standby={standby},
              lock_ttl={lock_ttl})
def bounded(seconds):
    _body("bounded", seconds)


@app.task(name="kill.plain")
def plain(seconds):
    _body("plain", seconds)
"""


def _start(directory: str, module: str, n: int) -> subprocess.Popen[bytes]:
    return start_worker(directory, module, f"w{n}", os.path.join(directory, f"worker-{n}.log"))


def _runs(path: Path) -> list[tuple[float, float, str]]:
    if not path.exists():
        return []
    rows = (line.split() for line in path.read_text().splitlines() if line.strip())
    return [(float(s), float(e), t) for s, e, t in rows]


SETTINGS = {
    "today": "{}",
    "redelivery": (
        "{'task_acks_late': True, 'worker_prefetch_multiplier': 1, "
        "'broker_transport_options': {'visibility_timeout': 10, "
        "'unacked_restore_interval': 1, 'unacked_restore_throttle': 1}}"
    ),
}
"""The app settings of each ``--settings`` name (see the module)."""


def _beside(runs: list[tuple[float, float, str]]) -> int:
    """Tasks two of whose runs overlapped in time (ran beside themselves)."""
    by_task: dict[str, list[tuple[float, float]]] = {}
    for start, end, task_id in runs:
        by_task.setdefault(task_id, []).append((start, end))
    return sum(
        1
        for spans in by_task.values()
        if any(b[0] < a[1] for a, b in itertools.pairwise(sorted(spans)))
    )


def one_round(args: argparse.Namespace, settings: str) -> dict[str, Any]:
    count, seconds, limit, interval, lock_ttl = (
        args.tasks,
        args.duration,
        args.limit,
        args.interval,
        args.lock_ttl,
    )
    with (
        RedisServer() as server,
        RedisServer() as other,
        tempfile.TemporaryDirectory() as directory,
    ):
        base = server.url.rsplit("/", 1)[0]
        # --journal: the broker on a Redis of its own, so parked runs are journaled there
        broker = other.url.rsplit("/", 1)[0] if args.journal else base
        module = f"bench_kill_{uuid.uuid4().hex[:8]}"
        records = os.path.join(directory, "runs")
        Path(directory, f"{module}.py").write_text(
            textwrap.dedent(
                APP.format(
                    broker=f"{broker}/1",
                    backend=f"{broker}/2",
                    locks=f"{base}/3",
                    records=records,
                    limit=limit,
                    lock_ttl=lock_ttl,
                    standby=args.standby,
                    conf=SETTINGS[settings],
                )
            )
            + HOOKS.format(records=records),
            encoding="utf-8",
        )
        sys.path.insert(0, directory)
        tasks = __import__(module)
        workers = [_start(directory, module, n) for n in range(4)]
        every = list(workers)  # killed ones too: their orphaned children are ended last
        started = 4
        time.sleep(6)  # the workers come up
        bounded = [tasks.bounded.delay(seconds).id for _ in range(count)]
        plain: list[str] = []
        drain = count * seconds / limit
        t0 = next_kill = time.monotonic()
        next_kill += interval * random.uniform(0.8, 1.2)
        kills: list[tuple[float, int]] = []  # (time, main pid)
        while time.monotonic() - t0 < drain or len(plain) < count:
            due = int(count * min(1.0, (time.monotonic() - t0) / drain))
            while len(plain) < due:
                plain.append(tasks.plain.delay(seconds).id)
            if time.monotonic() >= next_kill:
                victim = random.randrange(len(workers))
                os.kill(workers[victim].pid, signal.SIGKILL)
                kills.append((time.time(), workers[victim].pid))
                workers[victim].wait(5)
                workers[victim] = _start(directory, module, started)
                every.append(workers[victim])
                started += 1
                next_kill += interval * random.uniform(0.8, 1.2)
            time.sleep(0.02)
        # Until nothing new has run for a while (lapsed reservations come back after
        # lock_ttl; the sweepers then publish them).
        paths = {k: Path(f"{records}.{k}") for k in ("bounded", "plain")}
        last, seen = time.monotonic(), -1
        quiet = lock_ttl + 5 + (15 if settings == "redelivery" else 0)  # + visibility_timeout
        while time.monotonic() - last < quiet:
            now = sum(len(_runs(p)) for p in paths.values())
            if now != seen:
                seen, last = now, time.monotonic()
            time.sleep(0.5)
        locks = redis.Redis.from_url(f"{base}/3")
        sem = ParkingSemaphore(locks, "kill", limit=limit)
        info, permits = sem.parking_info(), len(sem.info().holders)
        stop_workers(workers, every)  # every: killed ones' orphaned pool children
        result: dict[str, Any] = {"kills": len(kills)}
        traces = read_events(Path(f"{records}.events"))
        for kind, sent in (("bounded", bounded), ("plain", plain)):
            runs = _runs(paths[kind])
            ran = Counter(t for _, _, t in runs)
            ended = {t: e for _, e, t in runs}
            result[kind] = {
                "sent": len(sent),
                "ran": len(ran),
                "lost": len(set(sent) - set(ran)),
                "twice": sum(1 for n in ran.values() if n > 1),
                "beside": _beside(runs),
                "peak": peak(runs),
                "summary": summary(sent, ended, traces, kills),
            }
        if args.keep:
            kept = tempfile.mkdtemp(prefix="bench_kill_")
            for name in os.listdir(directory):
                if not name.endswith(".py") and os.path.isfile(os.path.join(directory, name)):
                    shutil.copy(os.path.join(directory, name), kept)
            Path(kept, "kills").write_text("".join(f"{t} {pid}\n" for t, pid in kills))
            result["kept"] = kept
        result["bounded"]["left"] = f"{permits} permits, {info.parked + info.claimed} parked"
        result["plain"]["left"] = "-"
        locks.close()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks of each kind")
    parser.add_argument("--duration", type=float, default=0.2, help="seconds each task sleeps")
    parser.add_argument("--limit", type=int, default=3, help="concurrency_limit")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--lock-ttl", type=float, default=10.0, help="lock_ttl of the task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--standby", type=int, default=0, help="concurrency_standby")
    parser.add_argument(
        "--journal",
        action="store_true",
        help="the broker on a second Redis (parked runs journaled there)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep each round's worker logs and event files (path printed)",
    )
    parser.add_argument(
        "--settings",
        default="today",
        help="comma-separated: today, redelivery (see the module); each round runs each",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of round 1 (+1 per round)")
    args = parse_args(parser)
    names = [name.strip() for name in args.settings.split(",") if name.strip()]
    for name in names:
        if name not in SETTINGS:
            parser.error(f"--settings: {name!r} is not one of {', '.join(SETTINGS)}")
    rows, losses = [], []
    totals = Counter[str]()
    for n in range(args.rounds):
        for settings in names:
            if args.seed is not None:
                random.seed(args.seed + n)  # the same kill schedule for each settings
            r = one_round(args, settings)
            b, p = r["bounded"], r["plain"]
            for kind in ("bounded", "plain"):
                k = r[kind]
                sm = k["summary"]
                key = f"{settings} {kind}"
                totals.update({key: k["lost"], f"{key} twice": k["twice"]})
                totals.update({f"{key} exposed": sm.exposed, f"{key} saved": sm.saved})
                totals.update({f"{key} beside": k["beside"]})
                for place, c in sm.places.items():
                    totals[f"{key} {place}"] += c
                rows.append(
                    [
                        f"#{n + 1} {settings} {kind}",
                        r["kills"],
                        k["sent"],
                        k["ran"],
                        k["lost"],
                        f"{k['twice']}/{k['beside']}",
                        k["peak"],
                        f"{sm.publishes:.2f}",
                        f"{sm.exposed}/{sm.saved}",
                        k["left"],
                        ", ".join(f"{c} {p}" for p, c in sorted(sm.places.items())) or "-",
                    ]
                )
                losses += [f"#{n + 1} {settings} {kind} {line}" for line in sm.lines]
            print(
                f"round {n + 1} ({settings}): lost {b['lost']} bounded / {p['lost']} plain"
                + (f"  (kept in {r['kept']})" if "kept" in r else ""),
                flush=True,
            )
    print(
        f"\n{args.tasks} bounded (limit {args.limit}, parked) + {args.tasks} plain tasks of "
        f"{args.duration * 1000:g} ms, 4 workers x 4 (prefork), a random worker main "
        f"process SIGKILLed every ~{args.interval:g}s and replaced; lock_ttl "
        f"{args.lock_ttl:g}s; broker "
        f"{'on its own Redis (journal on)' if args.journal else 'on the lock Redis'}; "
        f"settings {', '.join(names)}"
        + (f"; seeds {args.seed}..{args.seed + args.rounds - 1}" if args.seed is not None else "")
        + "\n"
    )
    print_table(
        [
            "round",
            "kills",
            "sent",
            "ran",
            "lost",
            "ran twice/beside itself",
            "peak",
            "msgs/task",
            "in killed main/ran",
            "left in Redis",
            "lost where (orig: Celery's, repub: ours)",
        ],
        rows,
    )
    print("\n" + "\n".join(losses) if losses else "")
    for settings in names:
        ours = sum(
            c
            for key, c in totals.items()
            if key.startswith(f"{settings} bounded repub ") and not key.endswith(" running")
        )
        b, p = f"{settings} bounded", f"{settings} plain"
        causes = {
            kind: ", ".join(
                f"{c} {key[len(kind) + 1 :]}"
                for key, c in sorted(totals.items())
                if key.startswith(f"{kind} orig ") or key.startswith(f"{kind} repub ")
            )
            or "-"
            for kind in (b, p)
        }
        print(
            f"{settings}: total lost {totals[b]} bounded, {totals[p]} plain ({args.rounds} "
            f"rounds); by cause: bounded {causes[b]}; plain {causes[p]}; ran twice "
            f"{totals[b + ' twice']} bounded ({totals[b + ' beside']} beside itself), "
            f"{totals[p + ' twice']} plain ({totals[p + ' beside']} beside itself); in a "
            f"killed main at its kill (and ran all the same): bounded "
            f"{totals[b + ' exposed']} ({totals[b + ' saved']}), plain "
            f"{totals[p + ' exposed']} ({totals[p + ' saved']}); lost by parking (a "
            f"re-published message lost and never published again): {ours}"
        )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
