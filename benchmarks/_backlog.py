"""The backlog case of bench_bounded.py: a burst far over the limit, parked vs re-publish.

``count`` tasks of ``seconds`` each are sent at once to 2 workers x 4 processes
(prefork) with ``concurrency_limit=limit``: most are refused a permit. Our task types,
interleaved round by round on the same workers, differ only in ``concurrency_park``:

* **parked** (the default): a refused run is parked in Redis; the release that frees
  a permit publishes the oldest one;
* **parked in child**: the same, with the worker's request class of before (no parking
  at intake: every refused run goes through a pool process, see bounded/intake.py);
* **parked+standby** (``concurrency_standby=limit``): the same, with that many parked
  runs published ahead to wait in place, so a release hands over the permit at once;
* **re-publish** (``concurrency_park=False``): a refused run is sent back to the
  broker with a countdown (0.2 s + up to 0.3 s of jitter) and tried again.

Interleaved with them, two controls: the same body as a plain Celery task (no limit of
ours) on a third worker whose *concurrency* is the limit, so Celery's own per-task
hand-off is the only overhead; what a Celery-based design could at best keep:

* **plain c2**: 1 worker x ``limit`` processes, ``--prefetch-multiplier 1``, the ack at
  the start (Celery's default). Plain Celery's best FIFO: one consumer reads one list
  in sending order, the pool's outbound buffer is first in first out and ``-O fair``
  (the default) writes a job only to an idle process; the acked running runs do not
  count against the prefetch (multiplier x concurrency = ``limit``), so the next
  ``limit`` messages already wait in the worker's main process when a process frees:
  a hand-off never waits on the broker. (2 workers x 1 process would be two consumers,
  each starting what it happened to read first: not FIFO across them.)
* **plain c2 acks_late** (``acks_late=True``, same worker): the ack at the end, so the
  worker reads the next message only once a run ends: each hand-off goes through the
  broker, as a release of ours does, without our scripts.

"ours - plain" then prints the medians' differences: (a) p99 and drain.

Per run: the drain time (first send to last end) over the ideal (count x seconds /
limit), re-publishes per task (messages published, the broker's ``LPUSH`` calls / count,
minus the one each task was sent as) and deliveries per task, the workers'
CPU seconds per task (main processes and pool children, from /proc, over the whole
batch) and per parked task beyond an unbounded batch of the same tasks, the log
lines per task, the peak concurrency (interval sweep), the wait before each run
started (p50/p99), two lateness figures side by side (and their maximum), and the
hand-off itself:

* **(a) late vs nominal**: p50/p99 of ``start - (first send + (i // limit) x seconds)``
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
from _backlog_print import CONTROLS, MODES, print_backlog
from _common import add_to_dump, peak, percentile

from celery_redislock.testing import RedisServer

APP = """
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


@app.task(name="bench.late", acks_late=True)
def late(label, i, sent, seconds):
    _body(label, i, sent, seconds)
"""

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


def _batch(
    task: Any,
    queue: str,
    records: redis.Redis,
    directory: str,
    pids: list[int],
    count: int,
    seconds: float,
    limit: int,
) -> dict[str, Any]:
    label = f"runs-{uuid.uuid4().hex[:8]}"
    lines, received, cpu = _lines(directory), _pushes(records), _cpu(pids)
    first = time.time()
    ids = {task.apply_async((label, i, time.time(), seconds), queue=queue).id for i in range(count)}
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
    idle = [
        start - max(e for e in ends if e <= start)  # the freed permit's idle time
        for _, _, start, _ in rows
        if ends[0] <= start
    ]
    return {
        "drain": last - first,
        "publishes": (_pushes(records) - received) / count,
        "cpu": (_cpu(pids) - cpu) / count,
        "log lines": (_lines(directory) - lines) / count,
        "peak": peak([(start, end) for _, _, start, end in rows]),
        "wait p50": percentile(waits, 50),
        "wait p99": percentile(waits, 99),
        "late p50": percentile(late, 50),
        "late p99": percentile(late, 99),
        "late max": max(late),
        "replayed p50": percentile(replayed, 50),
        "replayed p99": percentile(replayed, 99),
        "replayed max": max(replayed),
        "ids": ids,
        "handoff p50": percentile(idle, 50),
        "handoff p99": percentile(idle, 99),
        # --dump (#28's figures): each run's (index, sent, start, end), and the first send
        "first": first,
        "rows": rows,
    }


_TASKS = dict(
    zip(MODES, ("plain", "plain", "late", "parked", "inchild", "standby", "republish"), strict=True)
)


def run_backlog(
    count: int,
    seconds: float,
    limit: int,
    rounds: int,
    modes: tuple[str, ...] = MODES,
    stages: bool = False,
    dump: str | None = None,
) -> None:
    """Run the backlog case and print its table (see the module docstring); ``dump``:
    write every run's times to this JSON file (``benchmarks/plot_figures.py``)."""
    from bench_bounded import worker

    with RedisServer() as server, tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        base = server.url.rsplit("/", 1)[0]
        module = f"bench_backlog_{uuid.uuid4().hex[:8]}"
        source = APP.format(
            broker=f"{base}/1",
            backend=f"{base}/2",
            locks=f"{base}/3",
            limit=limit,
            stages=directory if stages else "",
        )
        Path(directory, f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        if stages:
            shutil.copy(Path(__file__).with_name("_stages.py"), directory)
        sys.path.insert(0, directory)
        tasks = __import__(module)
        records = redis.Redis.from_url(f"{base}/3")
        pids = [stack.enter_context(worker(directory, module, "bounded", 4)) for _ in range(2)]
        control = (
            [
                stack.enter_context(
                    worker(directory, module, "control", limit, ("--prefetch-multiplier", "1"))
                )
            ]
            if set(modes) & set(CONTROLS)
            else []
        )

        def batch(mode: str, n: int, duration: float) -> dict[str, Any]:
            queue, group = ("control", control) if mode in CONTROLS else ("bounded", pids)
            task = getattr(tasks, _TASKS[mode])
            return _batch(task, queue, records, directory, group, n, duration, limit)

        for mode in modes:  # warm-up
            batch(mode, 16, 0.01)
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                results[mode].append(batch(mode, count, seconds))
        records.close()
        stamps = _stages.collect(directory) if stages else {}
    print_backlog(results, count, seconds, limit, stamps)
    if dump:
        add_to_dump(
            limit=limit,
            seconds=seconds,
            modes={
                mode: [{"first": r["first"], "rows": r["rows"]} for r in rs]
                for mode, rs in results.items()
            },
        )
