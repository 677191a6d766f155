"""Beat on several hosts (issue #26): the full scenario, and failover times beside RedBeat.

Run from the repository root::

    python benchmarks/bench_beat.py                      # everything (about 10 minutes)
    python benchmarks/bench_beat.py --scenario 60 --kills 5 --redbeat-wait 30   # short

Everything runs on one private ``redis-server`` (broker, locks, RedBeat), with a real
``celery worker`` (solo) recording each run: entry, slot and sending beat (from the
message headers ``LeaderScheduler`` stamps) and when it ran.

0. **Control.** Three plain ``celery beat`` (Celery's ``PersistentScheduler``) for
   ``--control`` seconds: how many runs per scheduled second.
1. **Scenario.** Three ``celery beat -S celery_redislock.beat:LeaderScheduler``
   (``--inner``: Celery's ``PersistentScheduler`` or django-celery-beat's
   ``DatabaseScheduler`` on one SQLite file), an interval entry every second and a
   crontab entry every minute, for ``--scenario`` seconds: the first leader reaches
   the lock Redis through a fault proxy and is cut off (its connection stalled) for
   20 s, then the leader is SIGKILLed (and a beat started in its place), then the
   leader is SIGSTOPped for 15 s and resumed. Reported: runs, slots sent twice,
   slots never sent, the longest gap between runs of the 1 s entry (bound: one lease
   plus one interval), what the resumed beat sent after it woke.
2. **Failover.** ``--kills`` times: SIGKILL the leader (at a random moment) and time
   kill -> first run sent by another beat (at the worker); a new beat replaces the
   killed one. ``LeaderScheduler`` with its default lease (10 s), and with ``--lease``.
3. **RedBeat** with its default settings (lock timeout 5 x ``beat_max_loop_interval``
   = 1500 s, standbys retrying every 300 s), three beats, on the same Redis: the same
   kill, waited for ``--redbeat-wait`` seconds per kill (a takeover can take up to
   about 30 minutes, so one kill by default).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from _common import add_to_dump, parse_args, percentile, print_table  # noqa: E402

from celery_redislock.testing import RedisServer  # noqa: E402
from tests.faults import FaultProxy  # noqa: E402
from tests.integration.beat.beats import (  # noqa: E402
    BeatProcess,
    beat_module,
    module_env,
    runs,
    wait_for,
)
from tests.integration.workers import LOCKS_DB, AppModule, WorkerProcess  # noqa: E402

SCHEDULE = (
    '{"every-second": {"task": "beat_tick", "schedule": 1.0, "args": ("every-second",)},'
    ' "every-minute": {"task": "beat_tick", "schedule": crontab(), "args": ("every-minute",)}}'
)
LEADER_LINE = "beat: leading group"
LOST_LINE = "lost the leader lease"

DJANGO_SETTINGS = """\
SECRET_KEY = "bench"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {path!r},
                          "OPTIONS": {{"timeout": 30}}}}}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""
DJANGO_SETUP = """
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench_django_settings")
import django
django.setup()
"""


def leads(beat: BeatProcess) -> bool:
    log = beat.log()
    return log.count(LEADER_LINE) > log.count(LOST_LINE)


def current_leader(beats: list[BeatProcess], timeout: float = 60) -> BeatProcess:
    found: list[BeatProcess] = []

    def one() -> bool:
        found[:] = [b for b in beats if b.process and b.process.poll() is None and leads(b)]
        return len(found) == 1

    wait_for(one, timeout, "one leader")
    return found[0]


def owner_of(beat: BeatProcess) -> str:
    line = [x for x in beat.log().splitlines() if LEADER_LINE in x][-1]
    return line.split(" as ")[1].split(" ")[0]


def make_module(directory: Path, url: str, conf: str, inner: str) -> AppModule:
    prelude = ""
    if inner == "database":
        (directory / "bench_django_settings.py").write_text(
            DJANGO_SETTINGS.format(path=str(directory / "beat.sqlite3")), encoding="utf-8"
        )
        prelude = DJANGO_SETUP
        conf = (
            conf[:-1]
            + ', "redislock_beat_scheduler": '
            + ('"django_celery_beat.schedulers:DatabaseScheduler"}')
        )
    module = beat_module(directory, url, schedule=SCHEDULE, conf=conf, prelude=prelude)
    if inner == "database":
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=directory,
            env={**module_env(module), "DJANGO_SETTINGS_MODULE": "bench_django_settings"},
            check=True,
        )
    return module


def scenario(url: str, seconds: float, lease: float, inner: str) -> None:
    directory = Path(tempfile.mkdtemp(prefix="bench-beat-"))
    conf = (
        f'{{"redislock_beat_lease": {lease}, '
        '"redislock_client_options": {"socket_timeout": 1.0}}'
    )
    module = make_module(directory, url, conf, inner)
    host, port = url.split("//")[1].split("/")[0].split(":")
    with (
        FaultProxy(host, int(port), db=LOCKS_DB) as proxy,
        WorkerProcess(module, pool="solo", concurrency=1),
    ):
        first = BeatProcess(module, lock_url=proxy.url).start()
        beats = [first]
        events: list[str] = []
        t0 = time.time()
        resumed_at = stopping_at = 0.0
        paused: BeatProcess | None = None
        try:
            wait_for(lambda: leads(first), 60, "the first leader")
            beats += [BeatProcess(module).start(), BeatProcess(module).start()]
            step = seconds / 9
            time.sleep(step)
            proxy.pause()
            events.append(f"{time.time() - t0:6.1f} s  leader cut from the lock Redis (20 s)")
            time.sleep(20)
            proxy.resume()
            time.sleep(step)
            leader = current_leader(beats)
            leader.kill()
            events.append(f"{time.time() - t0:6.1f} s  leader SIGKILLed")
            beats.append(BeatProcess(module).start())
            time.sleep(step * 2)
            paused = current_leader(beats)
            paused.signal(signal.SIGSTOP)
            events.append(f"{time.time() - t0:6.1f} s  leader SIGSTOPped (15 s)")
            time.sleep(15)
            paused.signal(signal.SIGCONT)
            resumed_at = time.time()
            events.append(f"{resumed_at - t0:6.1f} s  resumed")
            time.sleep(max(5.0, seconds - (time.time() - t0)))
            stopping_at = time.time()
        finally:
            for beat in beats:
                beat.stop()
        time.sleep(3)
        recorded = runs(module, url)
    print(f"\n## Scenario: 3 beats, {inner} scheduler, lease {lease:g} s, {seconds:g} s")
    for line in events:
        print("  " + line)
    rows = []
    for entry, interval in (("every-second", 1.0), ("every-minute", 60.0)):
        mine = [r for r in recorded if r.entry == entry]
        counts = collections.Counter(r.slot for r in mine)
        twice = sum(1 for n in counts.values() if n > 1)
        slots = sorted(s for s in counts if s is not None)
        expected = round((slots[-1] - slots[0]) / interval) + 1 if slots else 0
        missing = expected - len(slots)
        times = sorted(r.ran_at for r in mine)
        gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
        rows.append((entry, len(mine), len(slots), twice, missing, f"{gap:.2f}"))
    print_table(("entry", "runs", "slots", "sent twice", "never sent", "longest gap s"), rows)
    woke = owner_of(paused) if paused is not None else None
    late = [r for r in recorded if r.sender == woke and resumed_at < r.ran_at < stopping_at]
    print(
        f"  bound on the gap: lease + interval = {lease + 1:g} s; runs sent by the "
        f"resumed beat after it woke: {len(late)}"
    )


def timeline(
    module: AppModule, url: str, kills: list[tuple[float, str | None, float | None]], wait: float
) -> list[dict[str, Any]]:
    """For ``--dump`` (#28's failover figure): each kill -- when, which beat, how long
    to the takeover -- with the runs of the 1 s entry from 5 s before it to 5 s after
    the takeover, as (seconds since the kill, whether the killed beat sent it: None
    when the scheduler does not say which beat sent it)."""
    recorded = [r for r in runs(module, url) if r.entry == "every-second"]
    out = []
    for killed_at, killed, took in kills:
        until = killed_at + (wait if took is None else took) + 5
        out.append(
            {
                "killed_at": killed_at,
                "took": took,
                "runs": [
                    [round(r.ran_at - killed_at, 3), None if killed is None else r.sender == killed]
                    for r in recorded
                    if killed_at - 5 <= r.ran_at <= until
                ],
            }
        )
    return out


def failovers(url: str, kills: int, lease: float | None) -> tuple[list[float], list[Any]]:
    directory = Path(tempfile.mkdtemp(prefix="bench-beat-"))
    conf = "{}" if lease is None else f'{{"redislock_beat_lease": {lease}}}'
    module = make_module(directory, url, conf, "persistent")
    times: list[float] = []
    killings: list[tuple[float, str | None, float | None]] = []
    with WorkerProcess(module, pool="solo", concurrency=1):
        beats = [BeatProcess(module).start() for _ in range(3)]
        try:
            for _ in range(kills):
                leader = current_leader(beats)
                time.sleep(random.uniform(1.0, 4.0))
                killed = owner_of(leader)
                killed_at = time.time()
                leader.kill()
                beats.remove(leader)
                beats.append(BeatProcess(module).start())
                times.append(first_run_after(module, url, killed_at, killed) - killed_at)
                killings.append((killed_at, killed, times[-1]))
        finally:
            for beat in beats:
                beat.stop()
    return times, timeline(module, url, killings, 0.0)


def first_run_after(module: AppModule, url: str, since: float, not_by: str) -> float:
    """When the first run sent after ``since`` by a beat other than ``not_by`` ran."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        later = [r.ran_at for r in runs(module, url) if r.ran_at > since and r.sender != not_by]
        if later:
            return min(later)
        time.sleep(0.1)
    raise AssertionError("no takeover within 120 s")


def sending(beat: BeatProcess) -> Callable[[], bool]:
    """A check: ``beat`` logged two sends."""
    return lambda: beat.log().count("Sending due task") >= 2


def redbeat_failover(url: str, kills: int, wait: float) -> tuple[list[float | None], list[Any]]:
    directory = Path(tempfile.mkdtemp(prefix="bench-redbeat-"))
    module = beat_module(directory, url, schedule=SCHEDULE, conf='{"redbeat_key_prefix": app.main}')
    out: list[float | None] = []
    killings: list[tuple[float, str | None, float | None]] = []
    with WorkerProcess(module, pool="solo", concurrency=1):
        beats = [
            BeatProcess(module, scheduler="redbeat.RedBeatScheduler").start() for _ in range(3)
        ]
        try:
            for _ in range(kills):
                wait_for(
                    lambda: sum("beat: Acquired lock" in b.log() for b in beats) >= 1, 120, "lock"
                )
                leader = next(b for b in beats if "beat: Acquired lock" in b.log())
                wait_for(sending(leader), 60, "sends")
                time.sleep(random.uniform(1.0, 4.0))
                killed_at = time.time()
                leader.kill()
                beats.remove(leader)
                beats.append(BeatProcess(module, scheduler="redbeat.RedBeatScheduler").start())
                deadline = time.time() + wait
                took: float | None = None
                while time.time() < deadline:
                    later = [r for r in runs(module, url) if r.ran_at > killed_at + 0.5]
                    if later:
                        took = later[0].ran_at - killed_at
                        break
                    time.sleep(0.5)
                out.append(took)
                killings.append((killed_at, None, took))  # RedBeat stamps no sender
        finally:
            for beat in beats:
                beat.stop()
    return out, timeline(module, url, killings, wait)


def control(url: str, seconds: float) -> None:
    """Three plain ``PersistentScheduler`` beats for ``seconds``: what is sent."""
    directory = Path(tempfile.mkdtemp(prefix="bench-plain-"))
    module = beat_module(directory, url, schedule=SCHEDULE)
    with WorkerProcess(module, pool="solo", concurrency=1):
        beats = [
            BeatProcess(module, scheduler="celery.beat:PersistentScheduler").start()
            for _ in range(3)
        ]
        try:
            wait_for(lambda: all(sending(b)() for b in beats), 60, "three plain beats")
            time.sleep(seconds)
        finally:
            for beat in beats:
                beat.stop()
        time.sleep(2)
    recorded = [r for r in runs(module, url) if r.entry == "every-second"]
    span = max(r.ran_at for r in recorded) - min(r.ran_at for r in recorded)
    print(f"\n## Control: 3 plain Celery beats, {seconds:g} s")
    print(
        f"  every-second: {len(recorded)} runs in {span:.0f} s (one per second would be "
        f"{span + 1:.0f}): {len(recorded) / (span + 1):.2f} runs per scheduled second"
    )


def describe(name: str, times: list[float]) -> tuple[object, ...]:
    return (
        name,
        len(times),
        f"{statistics.median(times):.2f}",
        f"{percentile(times, 95):.2f}",
        f"{max(times):.2f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", type=float, default=180.0, help="scenario seconds")
    parser.add_argument("--inner", choices=("persistent", "database", "both"), default="both")
    parser.add_argument("--scenario-lease", type=float, default=3.0)
    parser.add_argument("--control", type=float, default=30.0, help="plain beats, seconds")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease", type=float, default=3.0, help="a short lease, beside 10 s")
    parser.add_argument("--redbeat-kills", type=int, default=1)
    parser.add_argument("--redbeat-wait", type=float, default=120.0)
    args = parse_args(parser)
    print(f"load average at start: {Path('/proc/loadavg').read_text().strip()}")
    with RedisServer() as server:
        url = server.url
        inners = ("persistent", "database") if args.inner == "both" else (args.inner,)
        for inner in inners:
            if args.scenario > 0:
                scenario(url, args.scenario, args.scenario_lease, inner)
        if args.control > 0:
            control(url, args.control)
        rows = []
        timelines: dict[str, list[Any]] = {}
        if args.kills > 0:
            for lease in (None, args.lease):
                times, timelines_ = failovers(url, args.kills, lease)
                label = f"LeaderScheduler, lease {10.0 if lease is None else lease:g} s"
                rows.append(describe(label, times))
                timelines[label] = timelines_
        if args.redbeat_kills > 0:
            red, timelines["RedBeat, default settings"] = redbeat_failover(
                url, args.redbeat_kills, args.redbeat_wait
            )
            done = [t for t in red if t is not None]
            if done:
                rows.append(describe("RedBeat, default settings", done))
            for t in red:
                if t is None:
                    rows.append(
                        ("RedBeat, default settings", 1, f"> {args.redbeat_wait:g}", "-", "-")
                    )
        if rows:
            print("\n## Failover: SIGKILL of the leader -> first run sent by another beat (s)")
            print_table(("scheduler", "kills", "median", "p95", "max"), rows)
            add_to_dump(redbeat_wait=args.redbeat_wait, failovers=timelines)
    print(f"load average at end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
