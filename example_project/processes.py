"""Start and stop the example's Celery processes, leaving nothing behind.

Each :class:`Service` (a worker, beat) runs in a session and process group of its
own: a Ctrl-C in the terminal reaches only the driver, which then shuts every service
down in order, and the whole group -- the worker and its pool processes -- can be
checked and, if need be, killed at once. POSIX only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["Service", "beat", "group_members", "pid_alive", "worker"]

APP = "example_project.app"
"""The Celery app every service loads (``celery -A``)."""


def worker(name: str, *, concurrency: int, env: Mapping[str, str], log_dir: Path) -> Service:
    """A ``celery worker`` (prefork) named ``name@<host>``; ready when it logs so."""
    argv = [
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--hostname",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        # Two workers on one machine: no need for their chatter.
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
    ]
    return Service(name, argv, env=env, log_path=log_dir / f"{name}.log", ready_text=" ready.")


def beat(*, env: Mapping[str, str], log_dir: Path) -> Service:
    """``celery beat``, its schedule file in ``log_dir``; ready when it starts ticking."""
    argv = ["beat", "--schedule", str(log_dir / "beat-schedule"), "--loglevel", "INFO"]
    return Service(
        "beat", argv, env=env, log_path=log_dir / "beat.log", ready_text="beat: Starting..."
    )


class Service:
    """``python -m celery -A example_project.app <argv>`` in its own process group.

    Output goes to ``log_path``. :meth:`stop` asks for a warm shutdown (SIGTERM: a
    worker finishes the tasks it runs), kills the group if that takes too long, and
    waits until no process of the group is left.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        ready_text: str,
    ) -> None:
        self.name = name
        self.args = [sys.executable, "-m", "celery", "-A", APP, *argv]
        self.env = dict(env)
        self.log_path = log_path
        self.ready_text = ready_text
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.stopped_how = "not started"

    def start(self) -> Service:
        """Start the process (see :meth:`wait_ready`)."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.process.pid  # also its process group id
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the log says the service is ready; raise with the log if not."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout
        while self.ready_text not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log(self) -> str:
        """Everything the service wrote so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the log, for error messages."""
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> str:
        """Warm shutdown, then SIGKILL of the group after ``timeout`` seconds; wait
        until the group is empty. Returns (and keeps in ``stopped_how``) what it took."""
        process, self.process = self.process, None
        if process is None:
            return self.stopped_how
        began = time.monotonic()
        if process.poll() is not None:
            how = f"had exited by itself (code {process.returncode})"
        else:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
                how = f"warm shutdown in {time.monotonic() - began:.1f}s"
            except subprocess.TimeoutExpired:
                how = f"killed after {timeout:g}s (no warm shutdown)"
        # Pool processes orphaned by a killed main process are in the group too.
        if group_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        deadline = time.monotonic() + 5
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopped_how = how
        return how


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of process group ``pgid``."""
    if not os.path.isdir("/proc"):  # not Linux: ask the kernel about the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                    # pid (comm) state ppid pgrp ...; comm may contain spaces.
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie does not count)."""
    if os.path.isdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:  # not Linux: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
