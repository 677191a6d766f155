"""The backlog case of bench_bounded.py: a burst far over the limit, parked vs re-publish.

``count`` tasks of ``seconds`` each are sent at once to 2 workers x 4 processes
(prefork) with ``concurrency_limit=limit``: most are refused a permit. Two task types,
interleaved round by round on the same workers, differ only in ``concurrency_park``:

* **parked** (the default): a refused run is parked in Redis; the release that frees
  a permit publishes the oldest one;
* **parked in child**: the same, with the worker's request class of before (no parking
  at intake: every refused run goes through a pool process, see bounded/intake.py);
* **parked+standby** (``concurrency_standby=limit``): the same, with that many parked
  runs published ahead to wait in place, so a release hands over the permit at once;
* **re-publish** (``concurrency_park=False``): a refused run is sent back to the
  broker with a countdown (0.2 s + up to 0.3 s of jitter) and tried again.

Per run: the drain time (first send to last end) over the ideal (count x seconds /
limit), re-publishes per task (messages published, the broker's ``LPUSH`` calls / count,
minus the one each task was sent as) and deliveries per task, the workers'
CPU seconds per task (main processes and pool children, from /proc, over the whole
batch) and per parked task beyond an unbounded batch of the same tasks, the log
lines per task, the peak concurrency (interval sweep), the wait before each run
started (p50/p99), two lateness figures side by side (and their maximum), and the hand-off itself:

* **(a) late vs nominal**: p99 of ``start - (first send + (i // limit) x seconds)``
  for run i sent i-th: the schedule a zero-cost FIFO would keep. Cumulative: every
  hand-off's delay *and* every run's own Celery overhead add up along the queue
  (a run of the 30th slot carries 29 of each), the drain ratio's excess in ms;
* **(b) late vs replayed FIFO**: p50/p99 of ``start - ideal`` where ``ideal`` is
  strict FIFO replayed over the actual releases: the k-th run sent gets the k-th
  permit to come free (``limit`` free at the first send, then each run's recorded
  end, in time order), or its own sending if later. Per run, not cumulative: the
  hand-off's delay from the end of the run before, plus any run served out of
  sending order (one slot, ``seconds``, per inversion);
* **hand-off**: how long a freed permit stays idle (a run's start minus the latest
  end before it), p50/p99.

Percentiles are nearest-rank over the runs (``_common.percentile``: a p99 of 60 runs
is the 59th value; never beyond the largest, as ``statistics.quantiles``'s default
extrapolation was). ``--stages`` stamps every hand-off's stages in the workers and
prints their p50/p99 (see ``_stages.py``); ``--modes`` runs a subset.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import _stages
import redis
from _common import percentile, print_table

from celery_redislock.testing import RedisServer

APP = '''
import time
import redis
from celery import Celery
from celery_redislock import bounded_task

app = Celery("bench_backlog", broker={broker!r}, backend={backend!r}, set_as_current=False)
app.conf.update(redislock_url={locks!r}, broker_connection_retry_on_startup=True,
                task_ignore_result=True, worker_hijack_root_logger=False)
records = redis.Redis.from_url({locks!r})
STAGES = {stages!r}
if STAGES:  # --stages: stamp each hand-off (see _stages.py)
    import _stages
    from celery import current_task

    _stages.install(app, STAGES)


def _body(label, i, sent, seconds):
    start = time.time()
    if STAGES:
        _stages.stamp(current_task.request.id, "body", start)
    time.sleep(seconds)
    records.rpush(label, f"{{i}} {{sent}} {{start}} {{time.time()}}")


@bounded_task(app=app, name="bench.parked", concurrency_limit={limit}, concurrency_key="parked")
def parked(label, i, sent, seconds):
    _body(label, i, sent, seconds)


@bounded_task(app=app, name="bench.inchild", concurrency_limit={limit},
              concurrency_key="inchild", Request="celery_redislock.celery.logs:QuietRequest")
def inchild(label, i, sent, seconds):
    _body(label, i, sent, seconds)


@bounded_task(app=app, name="bench.standby", concurrency_limit={limit},
              concurrency_key="standby", concurrency_standby={limit})
def standby(label, i, sent, seconds):
    _body(label, i, sent, seconds)


@bounded_task(app=app, name="bench.republish", concurrency_limit={limit},
              concurrency_key="republish", concurrency_park=False)
def republish(label, i, sent, seconds):
    _body(label, i, sent, seconds)


@app.task(name="bench.plain")
def plain(label, i, sent, seconds):
    _body(label, i, sent, seconds)
'''

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pids: list[int]) -> float:
    """CPU seconds used so far by ``pids`` and their live children."""
    total = 0
    wanted = set(pids)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) in wanted or int(fields[1]) in wanted:
            total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / _TICK


def _lines(directory: str, text: str = "") -> int:
    count = 0
    for name in os.listdir(directory):
        if name.endswith(".log"):
            content = Path(directory, name).read_text(encoding="utf-8", errors="replace")
            count += sum(1 for line in content.splitlines() if text in line)
    return count


def _pushes(client: redis.Redis) -> int:
    """Messages published so far: the broker's LPUSH calls (kombu's Redis transport)."""
    return int(client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))


def _batch(task: Any, records: redis.Redis, directory: str, pids: list[int], count: int,
           seconds: float, limit: int) -> dict[str, Any]:  # fmt: skip
    label = f"runs-{uuid.uuid4().hex[:8]}"
    lines, received, cpu = _lines(directory), _pushes(records), _cpu(pids)
    first = time.time()
    ids = {task.apply_async((label, i, time.time(), seconds), queue="bounded").id
           for i in range(count)}  # fmt: skip
    deadline = time.monotonic() + 60 + count * seconds * 4
    while records.llen(label) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {records.llen(label)} of {count} runs ended")
        time.sleep(0.01)
    time.sleep(0.3)  # the last logs and CPU ticks
    rows = sorted(tuple(float(x) for x in r.split()) for r in records.lrange(label, 0, -1))
    last = max(end for _, _, _, end in rows)
    waits = [start - sent for _, sent, start, _ in rows]
    late = [start - (first + (int(i) // limit) * seconds) for i, _, start, _ in rows]
    ends = sorted(end for _, _, _, end in rows)
    # Strict FIFO replayed over the actual releases: the k-th permit to come free (the
    # limit free at the first send, then each run's end, in time order) goes to the
    # k-th run sent; its ideal start is then, or its sending if later.
    free = sorted([first] * limit + ends)
    replayed = [start - max(sent, free[int(i)]) for i, sent, start, _ in rows]
    idle = [start - max(e for e in ends if e <= start)  # the freed permit's idle time
            for _, _, start, _ in rows if ends[0] <= start]  # fmt: skip
    from bench_bounded import peak

    return {
        "drain": last - first,
        "publishes": (_pushes(records) - received) / count,
        "cpu": (_cpu(pids) - cpu) / count,
        "log lines": (_lines(directory) - lines) / count,
        "peak": peak([(start, end) for _, _, start, end in rows]),
        "wait p50": percentile(waits, 50),
        "wait p99": percentile(waits, 99),
        "late p99": percentile(late, 99),
        "late max": max(late),
        "replayed p50": percentile(replayed, 50),
        "replayed p99": percentile(replayed, 99),
        "replayed max": max(replayed),
        "ids": ids,
        "handoff p50": percentile(idle, 50),
        "handoff p99": percentile(idle, 99),
    }


MODES = ("unbounded", "parked", "parked in child", "parked+standby", "re-publish")
_TASKS = dict(zip(MODES, ("plain", "parked", "inchild", "standby", "republish"), strict=True))


def run_backlog(count: int, seconds: float, limit: int, rounds: int,
                modes: tuple[str, ...] = MODES, stages: bool = False) -> None:  # fmt: skip
    """Run the backlog case and print its table (see the module docstring)."""
    from bench_bounded import worker

    with RedisServer() as server, tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_backlog_{uuid.uuid4().hex[:8]}"
        source = APP.format(broker=f"{base}/1", backend=f"{base}/2", locks=f"{base}/3",
                            limit=limit, stages=directory if stages else "")  # fmt: skip
        Path(directory, f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        if stages:
            shutil.copy(Path(__file__).with_name("_stages.py"), directory)
        sys.path.insert(0, directory)
        tasks = __import__(module)
        records = redis.Redis.from_url(f"{base}/3")
        pids = [stack.enter_context(worker(directory, module, "bounded", 4)) for _ in range(2)]
        for mode in modes:  # warm-up
            _batch(getattr(tasks, _TASKS[mode]), records, directory, pids, 16, 0.01, limit)
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                results[mode].append(_batch(getattr(tasks, _TASKS[mode]), records, directory,
                                            pids, count, seconds, limit))  # fmt: skip
        records.close()
        stamps = _stages.collect(directory) if stages else {}
    _print(results, count, seconds, limit, stamps)


def _print(results: dict[str, list[dict[str, Any]]], count: int, seconds: float, limit: int,
           stamps: dict[str, dict[str, float]]) -> None:  # fmt: skip
    ideal = count * seconds / limit
    plain = results.get("unbounded")
    plain_cpu = statistics.median(r["cpu"] for r in plain) if plain else None
    rows = []
    for label in MODES:
        for i, r in enumerate(results.get(label, ())):
            bounded = label != "unbounded"
            parked_share = max(1.0, count - limit)  # runs refused at least once
            extra = ("-" if plain_cpu is None or not bounded else
                     f"{(r['cpu'] - plain_cpu) * count / parked_share * 1000:.1f}")  # fmt: skip
            rows.append([
                f"{label} #{i + 1}", f"{r['drain']:.2f}",
                f"{r['drain'] / ideal:.3f}" if bounded else "-",
                f"{r['publishes'] - 1:.2f}", f"{r['publishes']:.2f}", f"{r['cpu'] * 1000:.1f}",
                extra, f"{r['log lines']:.1f}",
                int(r["peak"]), f"{r['wait p50']:.2f}", f"{r['wait p99']:.2f}",
                f"{r['late p99'] * 1000:.0f} / {r['late max'] * 1000:.0f}" if bounded else "-",
                f"{r['replayed p50'] * 1000:.1f} / {r['replayed p99'] * 1000:.1f} / "
                f"{r['replayed max'] * 1000:.0f}" if bounded else "-",
                f"{r['handoff p50'] * 1000:.1f} / {r['handoff p99'] * 1000:.1f}"
                if bounded else "-",
            ])  # fmt: skip
    print(f"backlog: {count} tasks of {seconds * 1000:g} ms sent at once, limit {limit}, "
          f"2 workers x 4 (prefork); ideal drain {ideal:.2f} s; unbounded = the same tasks "
          "without a limit (all 8 slots)\n")
    print_table(["run", "drain s", "/ ideal", "re-publishes/task", "deliveries/task",
                 "worker CPU ms/task", "CPU ms/parked task", "log lines/task", "peak",
                 "wait p50 s", "wait p99 s", "(a) late p99/max ms vs nominal",
                 "(b) late p50/p99/max ms vs replayed FIFO", "hand-off p50/p99 ms"],
                rows)  # fmt: skip
    print("\n(a) start - (first send + (i // limit) x duration), run i sent i-th: "
          "cumulative, every hand-off's and every run's overhead adds up along the queue;\n"
          "(b) start - the moment the permit it gets under strict FIFO came free (the k-th "
          "run sent gets the k-th permit freed, from the runs' actual ends): per hand-off "
          "delay and queue order only.")  # fmt: skip
    for label in MODES:
        ids = set().union(*(r["ids"] for r in results.get(label, ())))
        table = _stages.report(stamps, ids) if stamps else []
        if table:
            print(f"\nhand-off stages, {label} (ms, over every run published by a release):")
            print_table(["stage", "what", "p50", "p99", "n"], table)
    print(f"\npython {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
