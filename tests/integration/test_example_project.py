"""``python -m example_project`` end to end, as the README tells users to run it.

The example is run as a subprocess from the repository root: on its own private
redis-server (``REDIS_URL`` unset), and on the test session's Redis. It must exit 0,
report zero overlaps and the partner API cap held, and leave no process behind --
checked here independently of the example's own check: every process it started
inherits a marker in its environment, and none may be left once it has exited.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from .workers import db_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARKER = "EXAMPLE_PROJECT_TEST_MARKER"
EXAMPLE_DB = 6  # not one of the integration tests' databases (see workers.py)

KEY_LINES = (
    "PASS  nightly_report: 0 overlapping runs",
    "PASS  sync_user: 0 overlapping runs of a user",
    "PASS  partner-api: max 3 at once, limit 3 held and reached",
    "PASS  `celery redislock list` listed the partner-api semaphore",
    "PASS  no process left behind",
    "PASS  every lock and permit released at the end",
    "RESULT: PASS (zero overlaps, partner-api cap held)",
)


def run_example(*args: str, redis_url: str | None = None) -> tuple[str, str]:
    """Run the example to the end; its output and the marker its processes carry."""
    marker = uuid.uuid4().hex
    env = {name: value for name, value in os.environ.items() if name != "REDIS_URL"}
    env[MARKER] = marker
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    done = subprocess.run(
        [sys.executable, "-m", "example_project", "--ascii", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output, marker


def _stat(pid: str) -> list[str] | None:
    """``state ppid pgrp ...`` of a live process (None if gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields


def processes_marked(marker: str) -> list[str]:
    """Command lines of the live processes whose environment carries ``marker``."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle not in environ.read() or _stat(pid) is None:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append(f"{pid}: {command}")
    return found


def group_members(pgid: int) -> list[str]:
    """Live processes of process group ``pgid``."""
    return [
        pid
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if (fields := _stat(pid)) is not None and int(fields[2]) == pgid
    ]


def reported_pids(output: str) -> dict[str, int]:
    """``{name: pid}`` from the report's Shutdown section."""
    section = output.split("Shutdown:", 1)[1].split("Checks:", 1)[0]
    return {name: int(pid) for name, pid in re.findall(r"^\s+(\S+)\s+pid (\d+)", section, re.M)}


def assert_nothing_left(output: str, marker: str) -> None:
    """No process of the example is left: none carries the marker, none of the
    reported ones lives, nor any member of the workers' and beat's process groups."""
    assert processes_marked(marker) == []
    for name, pid in reported_pids(output).items():
        assert _stat(str(pid)) is None, f"{name} (pid {pid}) still runs"
        if name != "redis-server":  # the others each lead a process group
            assert group_members(pid) == [], f"processes of {name}'s group still run"


def _said_at(output: str, start: str) -> float:
    """The time stamp of the progress line that starts with ``start``."""
    found = re.search(rf"^\[ *([\d.]+)s\] {re.escape(start)}", output, re.M)
    assert found, f"no progress line {start!r} in:\n{output}"
    return float(found.group(1))


def assert_one_clock(output: str) -> None:
    """Every time in the report counts from the progress lines' zero: the list the
    report shows was taken between the lines around it, and the first sync_user bar
    of the timeline is drawn within the burst the lines say (a stamp is rounded to
    0.1s; a bar starts in the column holding its start)."""
    meanwhile, batch_done = _said_at(output, "meanwhile"), _said_at(output, "batch done")
    listed = re.search(r"redislock list` showed at ([\d.]+)s", output)
    assert listed, output
    assert meanwhile - 0.1 <= float(listed.group(1)) <= batch_done + 0.1, output
    per_column = re.search(r"1 column = ([\d.]+)s", output)
    assert per_column, output
    scale = float(per_column.group(1))
    bars = [line[22:] for line in output.splitlines() if line.startswith("sync_user(")]
    column = min(len(bar) - len(bar.lstrip()) for bar in bars)
    burst, burst_done = _said_at(output, "burst:"), _said_at(output, "burst done")
    assert burst - 0.1 <= (column + 1) * scale and column * scale <= burst_done + 0.1, output


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")


@needs_proc
def test_runs_on_its_own_private_redis() -> None:
    output, marker = run_example()
    for line in KEY_LINES:
        assert line in output, output
    assert "a private redis-server" in output
    # 12 calls on a pool of 3 over 6 processes: runs waited for a permit, parked (#29 item 6)
    assert re.search(r"parked \(pool full\) +[1-9]", output), output
    assert_one_clock(output)
    pids = reported_pids(output)
    assert set(pids) == {"worker-a", "worker-b", "beat", "redis-server"}, output
    assert_nothing_left(output, marker)


@needs_proc
def test_runs_on_the_given_redis_and_cleans_up(redis_url: str) -> None:
    url = db_url(redis_url, EXAMPLE_DB)
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.set("not-the-example's", "kept")
    try:
        output, marker = run_example("--duration", "6", redis_url=url)
        for line in KEY_LINES:
            assert line in output, output
        assert f"{url} (from REDIS_URL)" in output
        assert_one_clock(output)
        assert set(reported_pids(output)) == {"worker-a", "worker-b", "beat"}, output
        assert_nothing_left(output, marker)
        left = [key for key in client.scan_iter() if b"example-" in key]
        assert left == [], "the example left keys in a Redis it did not start"
        assert client.get("not-the-example's") == b"kept"
    finally:
        client.flushdb()
        client.close()
