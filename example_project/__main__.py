"""``python -m example_project``: run the whole example, report, clean up.

1. **Redis**: ``$REDIS_URL`` when set, else a private ``redis-server`` on a free port
   (from ``PATH``, or the one ``pip install celery-redislock[embedded]`` ships).
2. **Processes**: two ``celery worker`` (prefork, 3 processes each) and ``celery
   beat``, each in its own process group.
3. **Scenarios**: beat fires ``nightly_report`` every second for ``--duration``
   seconds; meanwhile a burst of 60 ``sync_user`` calls, then 12 partner API calls,
   and ``celery redislock list`` once while they hold their locks and permits.
4. **Shutdown**: beat; wait until every lock and permit is free; the workers (warm
   shutdown, killed after a timeout); Redis. Also on Ctrl-C, SIGTERM and errors.
5. **Report**: counts per scenario, the most runs at once per subject (an interval
   sweep over the recorded runs), a timeline, and the checks. Exit code 0 only when
   every check held; 1 when one failed; 2 on an error; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType, ModuleType

from . import processes, scenarios
from .processes import Service
from .report import Findings, ServiceEnd, render
from .timeline import Glyphs

__all__ = ["Example", "main"]

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``example_project`` package: on the children's path."""

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Example:
    """One run of the example: start, drive, stop, observe (see the module docs)."""

    def __init__(self, *, duration: float, log_dir: Path | None) -> None:
        self.duration = duration
        self.log_dir = log_dir
        self.began = time.monotonic()
        self.findings = Findings(duration=duration)
        self.services: list[Service] = []
        self.redis_pid: int | None = None
        self.interrupted = False

    def say(self, message: str) -> None:
        """A progress line, stamped with the seconds since the start."""
        print(f"[{time.monotonic() - self.began:5.1f}s] {message}", flush=True)

    def run(self) -> Findings:
        """Everything, in order; the processes are stopped whatever happens."""
        try:
            self._run()
        finally:
            self._check_redis_gone()
        return self.findings

    def _run(self) -> None:
        with contextlib.ExitStack() as stack:
            log_dir = self.log_dir or Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="redislock-example-"))
            )
            log_dir.mkdir(parents=True, exist_ok=True)
            url = self._redis(stack)
            namespace = f"example-{uuid.uuid4().hex[:8]}"
            env = self._environment(url, namespace)
            tasks = importlib.import_module("example_project.app")  # reads os.environ
            self.findings.began = self._began_on(tasks.recorder.now)
            try:
                self._start(env, log_dir)
                self._drive(tasks, env)
                self._drain(tasks)
                self._stop()
                self._collect(tasks)
            except KeyboardInterrupt:
                self.interrupted = True
                self.say("interrupted: shutting everything down ...")
                raise
            except Exception:
                self._stop()  # so that the logs are complete
                for service in self.services:
                    print(f"--- last lines of {service.name}'s log ---\n{service.log_tail()}")
                raise
            finally:
                self._stop()
                if self.redis_pid is None:  # a Redis that outlives the example: tidy up
                    _delete_namespace(tasks, namespace)

    def _began_on(self, clock: Callable[[], float]) -> float:
        """The progress lines' zero on ``clock`` (Redis server time, which the runs
        and the CLI's output are stamped with): the report counts every time from it.
        Read once, between two readings of our own clock, so off by at most half a
        round trip."""
        before = time.monotonic()
        server = clock()
        after = time.monotonic()
        return server - ((before + after) / 2 - self.began)

    def _redis(self, stack: contextlib.ExitStack) -> str:
        url = os.environ.get("REDIS_URL")
        if url:
            self.findings.redis = f"{url} (from REDIS_URL)"
            self.say(f"Redis: {url} (from REDIS_URL)")
            return url
        from celery_redislock.testing import RedisServer  # stdlib and redis-py only

        server = stack.enter_context(RedisServer())
        assert server.process is not None
        self.redis_pid = server.process.pid
        self.findings.redis = f"{server.url}, a private redis-server ({server.executable})"
        self.say(
            f"Redis: started a private redis-server at {server.url} "
            f"(pid {self.redis_pid}; {server.executable})"
        )
        return server.url

    def _environment(self, url: str, namespace: str) -> dict[str, str]:
        os.environ.update(REDIS_URL=url, EXAMPLE_NAMESPACE=namespace)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return env

    def _start(self, env: dict[str, str], log_dir: Path) -> None:
        workers = [
            processes.worker(name, concurrency=3, env=env, log_dir=log_dir)
            for name in ("worker-a", "worker-b")
        ]
        for service in workers:
            self.services.append(service.start())
        for service in workers:
            service.wait_ready()
        self.say(
            "workers ready: "
            + ", ".join(f"{s.name} (pid {s.pid}, prefork, 3 processes)" for s in workers)
        )
        beat = processes.beat(env=env, log_dir=log_dir)
        self.services.append(beat.start())
        beat.wait_ready()
        self.say(
            f"beat started (pid {beat.pid}): nightly_report every second, for {self.duration:g}s"
        )

    def _drive(self, tasks: ModuleType, env: dict[str, str]) -> None:
        beat_until = time.monotonic() + self.duration
        f = self.findings
        f.report_every, f.report_seconds = tasks.REPORT_EVERY, tasks.REPORT_SECONDS
        f.partner_limit = tasks.PARTNER_API_LIMIT

        self.say("burst: 60 requests call sync_user.delay(user_id) for 5 users ...")
        f.burst = scenarios.request_burst(tasks.sync_user, calls=60, users=5, threads=6)
        self.say(
            f"burst done: {len(f.burst.sent)} tasks sent, "
            f"{f.burst.returned_existing} calls got an existing AsyncResult"
        )

        f.partner_calls = 12
        self.say(f"batch: {f.partner_calls} call_partner_api.delay(n) at once ...")
        task_ids = scenarios.partner_batch(tasks.call_partner_api, f.partner_calls)
        self.say("meanwhile, `celery redislock list` until it shows the pool full ...")
        f.cli = self._list_while(
            env, tasks, lambda: all(tasks.call_partner_api.AsyncResult(i).ready() for i in task_ids)
        )
        f.partner_results = scenarios.results_of(tasks.call_partner_api, task_ids)
        self.say("batch done")

        if time.monotonic() < beat_until:
            self.say(f"letting beat tick until {self.duration:g}s have passed ...")
            time.sleep(max(0.0, beat_until - time.monotonic()))

    def _list_while(
        self, env: dict[str, str], tasks: ModuleType, done: Callable[[], bool]
    ) -> scenarios.CliOutput:
        """Run the CLI until it shows all permits of partner-api held, or ``done()``;
        the output showing the most holders of the pool."""
        best: scenarios.CliOutput | None = None
        for _ in range(5):
            output = scenarios.redislock_list(env, clock=tasks.recorder.now)
            if best is None or _permits_held(output) > _permits_held(best):
                best = output
            if _permits_held(output) >= tasks.PARTNER_API_LIMIT or done():
                break
        assert best is not None
        return best

    def _drain(self, tasks: ModuleType, timeout: float = 30.0) -> None:
        """Stop beat, then wait until no lock or permit is held (the last report)."""
        from celery_redislock.core.inventory import snapshot

        beat = next(s for s in self.services if s.name == "beat")
        self.say(f"stopping beat ({beat.stop()}); waiting for the last runs to end ...")
        deadline = time.monotonic() + timeout
        while True:
            held = [f"{e.kind} {e.name}" for e in snapshot(tasks.recorder.client, tasks.NAMESPACE)]
            if not held or time.monotonic() > deadline:
                self.findings.held_at_end = held
                return
            time.sleep(0.1)

    def _stop(self) -> None:
        """Stop beat, then both workers at once; record how each ended. Idempotent."""
        running = [s for s in self.services if s.process is not None]
        if not running:
            return
        timeout = 5.0 if self.interrupted else 15.0
        # Another Ctrl-C (or SIGTERM) must not cut the shutdown short: it is bounded.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
        try:
            for service in running:
                if service.name == "beat":
                    service.stop(timeout)
            workers = [s for s in running if s.name != "beat"]
            if workers:
                self.say("stopping the workers (warm shutdown) ...")
                with ThreadPoolExecutor(len(workers)) as pool:
                    list(pool.map(lambda s: s.stop(timeout), workers))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for service in self.services:
            assert service.pid is not None
            self.findings.ended.append(
                ServiceEnd(
                    service.name,
                    service.pid,
                    service.stopped_how,
                    processes.group_members(service.pid),
                )
            )
        self.say("beat and workers stopped")

    def _collect(self, tasks: ModuleType) -> None:
        f = self.findings
        f.runs = tasks.recorder.runs()
        f.events = tasks.recorder.events()
        # What celery_redislock logged about a duplicate, and about a full pool.
        for kind, needle in (("beat", "not sent:"), ("worker", "over the limit of pool")):
            logs = [service.log() for service in self.services if kind in service.name]
            line = next((ln for log in logs for ln in log.splitlines() if needle in ln), None)
            if line is not None:
                f.log_samples[kind] = line.split("] ", 1)[-1]  # without the time stamp

    def _check_redis_gone(self) -> None:
        if self.redis_pid is not None:
            left = [self.redis_pid] if processes.pid_alive(self.redis_pid) else []
            self.findings.ended.append(ServiceEnd("redis-server", self.redis_pid, "stopped", left))


def _permits_held(cli: scenarios.CliOutput) -> int:
    """The permits of partner-api held in a ``redislock list`` table (-1: not listed)."""
    found = re.search(r"partner-api\s+(\d+)/", cli.output)
    return int(found.group(1)) if found else -1


def _delete_namespace(tasks: ModuleType, namespace: str) -> None:
    """Delete the keys this run left in a Redis that outlives it: records, queue and
    its bindings, lock fence counters, results."""
    client = tasks.recorder.client
    with contextlib.suppress(Exception):
        ids = {run.task_id for run in tasks.recorder.runs()}
        keys = [f"celery-task-meta-{task_id}" for task_id in ids]
        keys += client.scan_iter(match=f"*{namespace}*", count=1000)
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Handle SIGTERM like Ctrl-C, so a killed driver still shuts everything down."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project",
        description="Run the celery_redislock example: two workers and beat on Redis "
        "($REDIS_URL, else a private redis-server), three scenarios, a report.",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=15.0,
        help="seconds beat keeps firing nightly_report (default 15; the "
        "other scenarios run meanwhile)",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep the workers' and beat's logs there (default: a "
        "temporary directory, removed at the end)",
    )
    parser.add_argument("--ascii", action="store_true", help="draw the timeline in ASCII")
    options = parser.parse_args(argv)
    if options.duration < 5:
        parser.error("--duration must be at least 5 seconds")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; the exit code (see the module docs)."""
    options = _parse(argv)
    example = Example(duration=options.duration, log_dir=options.log_dir)
    try:
        with _sigterm_as_interrupt():
            findings = example.run()
    except (KeyboardInterrupt, Exception) as exc:
        for end in example.findings.ended:
            state = f"LEFT BEHIND: pids {end.left}" if end.left else "nothing left"
            print(f"  {end.name:<14} pid {end.pid:<8} {end.how}; {state}", file=sys.stderr)
        what = "Interrupted" if isinstance(exc, KeyboardInterrupt) else f"Error: {exc!r}"
        print(f"{what}; the example's processes were stopped.", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 2
    width = shutil.get_terminal_size((110, 24)).columns
    glyphs = Glyphs.for_encoding(sys.stdout.encoding, ascii_only=options.ascii)
    lines, passed = render(findings, width=width, glyphs=glyphs)
    print("\n".join(lines), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
