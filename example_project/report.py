"""The example's report: counts per scenario, concurrency checks, the timeline.

:func:`render` turns the :class:`Findings` of one run into lines of text and says
whether every check held (the exit code of ``python -m example_project``). Every
time in it counts from one zero, the progress lines' (:attr:`Findings.began`). The
concurrency numbers come from the runs the tasks recorded (:mod:`.records`), the
counts of duplicates and re-schedules from celery_redislock's signals.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .records import Run
from .scenarios import Burst, CliOutput
from .timeline import Glyphs, draw, max_at_once, overlapping_pairs

__all__ = ["Check", "Findings", "ServiceEnd", "render"]


@dataclass(frozen=True)
class ServiceEnd:
    """How one process of the example ended, and which of its processes are left."""

    name: str
    pid: int
    how: str
    left: list[int]


@dataclass
class Findings:
    """Everything the driver set up and observed, for the report."""

    redis: str = ""
    duration: float = 0.0
    report_every: float = 0.0
    report_seconds: float = 0.0
    partner_limit: int = 0
    partner_calls: int = 0
    partner_results: list[object] = field(default_factory=list)
    burst: Burst = field(default_factory=Burst)
    runs: list[Run] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    cli: CliOutput | None = None
    held_at_end: list[str] | None = None
    ended: list[ServiceEnd] = field(default_factory=list)
    log_samples: dict[str, str] = field(default_factory=dict)
    began: float | None = None
    """Redis server time (epoch seconds) of the progress lines' ``0.0s``: the zero of
    every time in the report (None: the first recorded run's start)."""

    def zero(self) -> float | None:
        """The zero of the report's times, on the runs' clock (Redis server time)."""
        if self.began is not None:
            return self.began
        return min((run.start for run in self.runs), default=None)

    def runs_of(self, task: str) -> list[Run]:
        """The recorded runs of one task (short name)."""
        return [run for run in self.runs if run.task == task]


@dataclass(frozen=True)
class Check:
    """One pass/fail line of the report."""

    ok: bool
    text: str

    def line(self) -> str:
        """``PASS  text`` or ``FAIL  text``."""
        return f"  {'PASS' if self.ok else 'FAIL'}  {self.text}"


Section = tuple[list[str], list[Check]]


def _table(rows: Sequence[tuple[str, object, str]]) -> list[str]:
    return [f"  {label:<30}{value!s:>5}   {note}".rstrip() for label, value, note in rows]


def _per_worker(runs: Sequence[Run]) -> str:
    counts = Counter(run.node for run in runs)
    return ", ".join(f"{node} {n}" for node, n in sorted(counts.items())) or "none"


def _nightly(f: Findings) -> Section:
    runs = f.runs_of("nightly_report")
    refused = f.events.get("nightly_report:duplicate:enqueue:existing", 0)
    skipped = f.events.get("nightly_report:duplicate:run:skip", 0)
    pairs = overlapping_pairs(runs)
    lines = [
        f"1. nightly_report (@singleton_task): beat fires it every {f.report_every:g}s "
        f"for {f.duration:g}s; a run takes {f.report_seconds:g}s",
        *_table(
            [
                ("runs", len(runs), f"({_per_worker(runs)})"),
                ("beat ticks refused", refused, "(got the running copy's AsyncResult back)"),
                ("copies skipped by a worker", skipped, ""),
                ("max at once", max_at_once(runs), f"-> {pairs} overlapping runs"),
            ]
        ),
    ]
    if "beat" in f.log_samples:
        lines.append(f"  beat's log: {f.log_samples['beat']}")
    ok = pairs == 0 and len(runs) >= 2 and refused >= 1
    text = f"nightly_report: {pairs} overlapping runs; {refused} extra beat ticks refused"
    return lines, [Check(ok, text)]


def _sync(f: Findings) -> Section:
    runs, burst = f.runs_of("sync_user"), f.burst
    signalled = f.events.get("sync_user:duplicate:enqueue:existing", 0)
    by_user: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda run: (len(run.subject), run.subject)):
        by_user.setdefault(run.subject, []).append(run)
    pairs = sum(overlapping_pairs(user_runs) for user_runs in by_user.values())
    most = max(map(max_at_once, by_user.values()), default=0)
    counts = ", ".join(f"{s[len('sync_user(') : -1]}: {len(r)}" for s, r in by_user.items())
    lines = [
        f"2. sync_user(user_id) (@singleton_task): {burst.calls_made} calls for "
        f"{burst.users} users from {burst.threads} request threads",
        *_table(
            [
                ("calls that sent a task", len(burst.sent), ""),
                (
                    "calls given the existing one",
                    burst.returned_existing,
                    f"(AsyncResult of the queued/running copy; {signalled} signalled)",
                ),
                ("calls that raised", len(burst.errors), ""),
                ("runs", len(runs), f"(per user {counts})"),
                (
                    "max at once per user",
                    most,
                    f"-> {pairs} overlapping runs; {max_at_once(runs)} users at once at most",
                ),
            ]
        ),
    ]
    synced = all(str(value).endswith("synced") for value in burst.results.values())
    ok = (
        pairs == 0
        and not burst.errors
        and burst.returned_existing > 0
        and burst.shared_across_users == 0  # a duplicate got its own user's copy
        and signalled == burst.returned_existing  # the signal saw every duplicate
        and len(runs) == len(burst.sent) == len(burst.results)  # one run per task sent
        and synced
    )
    text = (
        f"sync_user: {pairs} overlapping runs of a user; each of the {burst.calls_made} "
        f"calls got an AsyncResult ({len(burst.sent)} new, {burst.returned_existing} existing)"
    )
    return lines, [Check(ok, text)]


def _partner(f: Findings) -> Section:
    runs, limit = f.runs_of("call_partner_api"), f.partner_limit
    most = max_at_once(runs)
    rescheduled = f.events.get("call_partner_api:rescheduled", 0)
    parked = f.events.get("call_partner_api:parked", 0)
    lines = [
        f"3. call_partner_api(n) (@bounded_task(concurrency_limit={limit}, "
        f'concurrency_key="partner-api")): {f.partner_calls} calls at once',
        *_table(
            [
                ("runs", len(runs), f"({_per_worker(runs)})"),
                (
                    "parked (pool full)",
                    parked,
                    "(waited in Redis for a permit, first in first out; not a retry)",
                ),
                *(
                    [("re-scheduled (pool full)", rescheduled, "(back to the queue; not a retry)")]
                    if rescheduled
                    else []
                ),
                ("max at once", most, f"(limit {limit})"),
            ]
        ),
    ]
    if "worker" in f.log_samples:
        lines.append(f"  a worker's log: {f.log_samples['worker']}")
    returned = sorted(map(str, f.partner_results)) == sorted(map(str, range(f.partner_calls)))
    held = "held" if most <= limit else "EXCEEDED"
    reached = "reached" if most == limit else "not reached"
    ok = most == limit and len(runs) == f.partner_calls and returned
    text = (
        f"partner-api: max {most} at once, limit {limit} {held} and {reached}; "
        f"{len(f.partner_results)}/{f.partner_calls} calls returned"
    )
    return lines, [Check(ok, text)]


def _cli(f: Findings) -> Section:
    cli = f.cli
    if cli is None:
        return [], [Check(False, "`celery redislock list` was not run")]
    zero = f.zero()
    at = "" if zero is None else f" at {cli.at - zero:.1f}s"
    lines = [
        f"What `{cli.command}` showed{at}:",
        textwrap.indent(cli.output or "(no output)", "  "),
    ]
    ok = cli.returncode == 0 and "partner-api" in cli.output
    text = f"`celery redislock list` listed the partner-api semaphore (exit code {cli.returncode})"
    return lines, [Check(ok, text)]


def _timeline(f: Findings, width: int, glyphs: Glyphs) -> Section:
    users = sorted({r.subject for r in f.runs_of("sync_user")}, key=lambda s: (len(s), s))
    groups = [
        ("nightly_report", f.runs_of("nightly_report"), False),
        *((user, [r for r in f.runs if r.subject == user], False) for user in users),
        ("partner-api", f.runs_of("call_partner_api"), True),
    ]
    title = (
        "Timeline (seconds since the start, as above): one row per lane;"
        " a singleton never needs a second lane"
    )
    return [title, *draw(groups, width=width, glyphs=glyphs, t0=f.zero())], []


def _shutdown(f: Findings) -> Section:
    lines = ["Shutdown:"]
    for end in f.ended:
        state = f"LEFT BEHIND: pids {end.left}" if end.left else "nothing left"
        lines.append(f"  {end.name:<14} pid {end.pid:<8} {end.how}; {state}")
    left = [pid for end in f.ended for pid in end.left]
    held = f.held_at_end
    return lines, [
        Check(
            bool(f.ended) and not left,
            f"no process left behind ({', '.join(end.name for end in f.ended)})",
        ),
        Check(
            held == [],
            "every lock and permit released at the end"
            + (f" (still held: {', '.join(held)})" if held else ""),
        ),
    ]


def render(f: Findings, *, width: int, glyphs: Glyphs) -> tuple[list[str], bool]:
    """The report's lines, and True when every check held."""
    out = ["", "=" * 78, f"celery_redislock example: report (Redis: {f.redis})", ""]
    checks: list[Check] = []
    sections = [_nightly(f), _sync(f), _partner(f), _cli(f), _timeline(f, width, glyphs)]
    for lines, section_checks in [*sections, _shutdown(f)]:
        out += [*lines, ""]
        checks += section_checks
    passed = all(check.ok for check in checks)
    out += ["Checks:", *(check.line() for check in checks), ""]
    out.append("RESULT: PASS (zero overlaps, partner-api cap held)" if passed else "RESULT: FAIL")
    return out, passed
