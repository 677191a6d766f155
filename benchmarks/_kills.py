"""Where each task lost under worker kills was lost (for ``bench_worker_kill.py``).

Every process of the benchmark's app appends one line per event to ``<records>.events``
(:data:`HOOKS`, added to the app module): ``<time> <event> <pid> <ppid> <task id>
<park token or ->``. Events: ``publish`` (``before_task_publish``: the sender, or the
process that re-publishes a parked run), ``received`` (a worker's main took the message
off the broker), ``parked`` (``permit_parked``), ``start`` (``task_prerun``, in a pool
child: the main is its ppid), ``duplicate`` (``permit_duplicate``: a copy skipped as
another message of a parked run that started already). The benchmark adds ``kill``
lines (the main's pid).

:func:`classify` says, for a task that never ran, where its last delivery went: its
last message was the original (``orig``: a loss plain Celery has too) or a re-publish
of a parked run (``repub``: ours), and then ``transit`` (never received: taken off the
list by a main killed before it recorded it), ``main`` (received, never started: in a
killed main's prefetch), ``running`` (started in a child of a main killed meanwhile;
a bounded run with its permit), ``waiting`` (a bounded run started without a permit:
waiting in place) or ``parked`` (parked, never published again).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HOOKS = """
import os as _os
from celery import signals as _signals
from celery_redislock.celery.signals import permit_acquired as _acquired
from celery_redislock.celery.signals import permit_parked as _parked
from celery_redislock.celery.signals import permit_duplicate as _duplicate

_EVENTS = {records!r} + ".events"


def _event(kind, task_id, token):
    now, pids = f"{{time.time():.6f}}", f"{{_os.getpid()}} {{_os.getppid()}}"
    with open(_EVENTS, "a") as out:
        out.write(f"{{now}} {{kind}} {{pids}} {{task_id}} {{token}}\\n")


def _token(headers):
    raw = (headers or {{}}).get("redislock_park")
    return str(raw).split()[0] if raw else "-"


@_signals.before_task_publish.connect(weak=False)
def _on_publish(sender=None, headers=None, **_):
    _event("publish", (headers or {{}}).get("id"), _token(headers))


@_signals.task_received.connect(weak=False)
def _on_received(sender=None, request=None, **_):
    _event("received", request.id, _token(request.request_dict))


@_signals.task_prerun.connect(weak=False)
def _on_start(sender=None, task_id=None, task=None, **_):
    _event("start", task_id, _token(task.request.headers))


@_parked.connect(weak=False)
def _on_parked(sender=None, task_id=None, **_):
    _event("parked", task_id, "-")


@_acquired.connect(weak=False)
def _on_permit(sender=None, task_id=None, **_):
    _event("permit", task_id, "-")


@_duplicate.connect(weak=False)
def _on_duplicate(sender=None, task_id=None, **_):
    _event("duplicate", task_id, "-")
"""


@dataclass
class Trace:
    """The events of one task, in time order: ``(time, event, pid, ppid, token)``."""

    events: list[tuple[float, str, int, int, str]] = field(default_factory=list)

    @property
    def publishes(self) -> int:
        """Messages of this task sent to the broker (each one is exposed to kills)."""
        return sum(1 for e in self.events if e[1] == "publish")


def read_events(path: Path) -> dict[str, Trace]:
    """Every task's trace from an events file (torn lines skipped)."""
    traces: dict[str, Trace] = defaultdict(Trace)
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:
                at, kind, pid, ppid, task_id, token = parts
                traces[task_id].events.append((float(at), kind, int(pid), int(ppid), token))
    for trace in traces.values():
        trace.events.sort()
    return traces


def classify(trace: Trace, kills: list[tuple[float, int]]) -> str:
    """Where a task that never ran was lost: ``"<orig|repub> <place> [<s> before the
    kill]"`` (see the module)."""
    publishes = [e for e in trace.events if e[1] == "publish"]
    if not publishes:
        return "never sent"
    at, _, _, _, token = publishes[-1]
    kind = "orig" if token == "-" else "repub"
    after = [e for e in trace.events if e[0] >= at and e[4] == token]
    started = [e for e in after if e[1] == "start"]
    permit = [e for e in trace.events if e[1] == "permit" and started and e[0] >= started[-1][0]]
    received = [e for e in after if e[1] == "received"]
    parked = [e for e in trace.events if e[1] == "parked" and e[0] >= at]
    skipped = [e for e in trace.events if e[0] >= at and e[1] == "duplicate"]
    if started and skipped and skipped[-1][0] >= started[-1][0]:
        return f"{kind} skipped (a copy of a started run)"
    if started:
        # A bounded run that started but holds no permit yet waits for one in place.
        waiting = any(e[1] in ("parked", "permit") for e in trace.events) and not permit
        place = "waiting" if waiting else "running"
        main, since = started[-1][3], started[-1][0]
    elif parked:
        return f"{kind} parked"
    elif received:
        place, main, since = "main", received[-1][2], received[-1][0]
    else:
        killed = [t for t, _ in kills if t >= at]
        gap = f" {killed[0] - at:.2f}s before a kill" if killed else ""
        return f"{kind} transit{gap}"
    killed = [t for t, pid in kills if pid == main and t >= since]
    return (
        f"{kind} {place} {killed[0] - since:.2f}s before its main's kill"
        if killed
        else (f"{kind} {place} (main not killed)")
    )


def in_flight(trace: Trace, ended: float | None, kill: tuple[float, int]) -> bool:
    """True when the task was in the killed main at the kill: its last event before
    it was that main receiving it or a child of that main starting it, and its run
    (if any) had not ended."""
    at, victim = kill
    before = [e for e in trace.events if e[0] <= at and e[1] != "publish"]
    if not before or (ended is not None and ended <= at):
        return False
    _, kind, pid, ppid, _ = before[-1]
    return (kind == "received" and pid == victim) or (
        kind in ("start", "permit") and ppid == victim
    )


@dataclass
class Summary:
    """One kind's losses in one round (see :func:`summary`)."""

    publishes: float  # messages per task: each one is exposed to the kills
    exposed: int  # tasks in a killed main at its kill (received, or running in a child)
    saved: int  # of those, tasks that ran all the same (published again)
    places: Counter[str]  # losses by "<orig|repub> <place>"
    lines: list[str]  # one per lost task


def summary(
    sent: list[str],
    ended: dict[str, float],
    traces: dict[str, Trace],
    kills: list[tuple[float, int]],
) -> Summary:
    """What the kills did to ``sent`` (``ended``: when each task's run ended)."""
    lines = [f"{t[:8]} {classify(traces[t], kills)}" for t in sent if t not in ended]
    exposed = {t for t in sent for kill in kills if in_flight(traces[t], ended.get(t), kill)}
    return Summary(
        publishes=sum(traces[t].publishes for t in sent) / max(1, len(sent)),
        exposed=len(exposed),
        saved=len(exposed & set(ended)),
        places=Counter(" ".join(line.split()[1:3]) for line in lines),
        lines=lines,
    )
