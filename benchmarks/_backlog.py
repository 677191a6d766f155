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
lines per task, the peak concurrency (interval sweep), and the wait before each run
started: p50/p99, and p99 of its lateness against the ideal FIFO schedule (task i,
sent i-th, starting at i // limit slots of ``seconds`` after the first send), which
adds up every hand-off's delay; the hand-off itself: how long a freed permit stays
idle (a run's start minus the latest end before it), p50/p99.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
from _common import print_table

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


def _body(label, i, sent, seconds):
    start = time.time()
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
           seconds: float, limit: int) -> dict[str, float]:  # fmt: skip
    label = f"runs-{uuid.uuid4().hex[:8]}"
    lines, received, cpu = _lines(directory), _pushes(records), _cpu(pids)
    first = time.time()
    for i in range(count):
        task.apply_async((label, i, time.time(), seconds), queue="bounded")
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
    idle = [start - max(e for e in ends if e <= start)  # the freed permit's idle time
            for _, _, start, _ in rows if ends[0] <= start]  # fmt: skip
    from bench_bounded import peak

    return {
        "drain": last - first,
        "publishes": (_pushes(records) - received) / count,
        "cpu": (_cpu(pids) - cpu) / count,
        "log lines": (_lines(directory) - lines) / count,
        "peak": peak([(start, end) for _, _, start, end in rows]),
        "wait p50": statistics.median(waits),
        "wait p99": statistics.quantiles(waits, n=100)[98],
        "late p99": statistics.quantiles(late, n=100)[98],
        "handoff p50": statistics.median(idle),
        "handoff p99": statistics.quantiles(idle, n=100)[98],
    }


def run_backlog(count: int, seconds: float, limit: int, rounds: int) -> None:
    """Run the backlog case and print its table (see the module docstring)."""
    from bench_bounded import worker

    with RedisServer() as server, tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_backlog_{uuid.uuid4().hex[:8]}"
        source = APP.format(broker=f"{base}/1", backend=f"{base}/2", locks=f"{base}/3",
                            limit=limit)  # fmt: skip
        Path(directory, f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        sys.path.insert(0, directory)
        tasks = __import__(module)
        records = redis.Redis.from_url(f"{base}/3")
        pids = [stack.enter_context(worker(directory, module, "bounded", 4)) for _ in range(2)]
        for task in (tasks.plain, tasks.parked, tasks.inchild, tasks.standby,
                     tasks.republish):  # warm-up
            _batch(task, records, directory, pids, 16, 0.01, limit)
        results: dict[str, list[dict[str, float]]] = {
            "unbounded": [], "parked": [], "parked in child": [], "parked+standby": [],
            "re-publish": []}  # fmt: skip
        for _ in range(rounds):
            for label, task in (("unbounded", tasks.plain), ("parked", tasks.parked),
                                ("parked in child", tasks.inchild),
                                ("parked+standby", tasks.standby),
                                ("re-publish", tasks.republish)):  # fmt: skip
                results[label].append(_batch(task, records, directory, pids, count, seconds,
                                             limit))  # fmt: skip
        records.close()

    ideal = count * seconds / limit
    plain_cpu = statistics.median(r["cpu"] for r in results["unbounded"])
    rows = []
    for label in ("parked", "parked in child", "parked+standby", "re-publish", "unbounded"):
        for i, r in enumerate(results[label]):
            parked_share = max(1.0, count - limit)  # runs refused at least once
            extra = (r["cpu"] - plain_cpu) * count / parked_share * 1000
            rows.append([
                f"{label} #{i + 1}", f"{r['drain']:.2f}",
                f"{r['drain'] / ideal:.3f}" if label != "unbounded" else "-",
                f"{r['publishes'] - 1:.2f}", f"{r['publishes']:.2f}", f"{r['cpu'] * 1000:.1f}",
                f"{extra:.1f}" if label != "unbounded" else "-", f"{r['log lines']:.1f}",
                int(r["peak"]), f"{r['wait p50']:.2f}", f"{r['wait p99']:.2f}",
                f"{r['late p99'] * 1000:.0f}" if label != "unbounded" else "-",
                f"{r['handoff p50'] * 1000:.1f} / {r['handoff p99'] * 1000:.1f}"
                if label != "unbounded" else "-",
            ])  # fmt: skip
    print(f"backlog: {count} tasks of {seconds * 1000:g} ms sent at once, limit {limit}, "
          f"2 workers x 4 (prefork); ideal drain {ideal:.2f} s; unbounded = the same tasks "
          "without a limit (all 8 slots)\n")
    print_table(["run", "drain s", "/ ideal", "re-publishes/task", "deliveries/task",
                 "worker CPU ms/task",
                 "CPU ms/parked task", "log lines/task", "peak", "wait p50 s", "wait p99 s",
                 "late p99 ms (vs FIFO)", "hand-off p50/p99 ms"], rows)  # fmt: skip
    print(f"\npython {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
