"""``celery -A proj redislock ...``: the real command on real locks and semaphores.

Most tests run ``python -m celery -A <module> redislock ...`` in a subprocess, with an
app module written to ``tmp_path``, so the ``celery.commands`` entry point, celery's
own option parsing and the exit codes are the real ones. A few run the click group
in-process (CliRunner) where only the command's logic is under test.
"""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import RedisLock, RedisSemaphore, SingletonTask
from celery_redislock.celery.cli import redislock
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.celery.tokens import parse_owner, queued_owner, running_owner
from celery_redislock.core.keys import KeySpace
from celery_redislock.core.parking import ParkingSemaphore, new_entry_id

from ..helpers import wait_until
from ..workers import BROKER_DB, LOCKS_DB, db_url

Run = Callable[..., subprocess.CompletedProcess[str]]

TASK_A = "5b0e7c1a-1111-4c8e-9f00-aaaaaaaaaaaa"
TASK_B = "c0ffee00-2222-4c8e-9f00-bbbbbbbbbbbb"

PRIMITIVE_KEYS = {
    "kind",
    "name",
    "held",
    "holders",
    "waiters",
    "limit",
    "available",
    "ttl",
    "fence",
    "since",
    "parked",
    "oldest_parked",
    "dead",
}
HOLDER_KEYS = {"owner", "task_id", "state", "ttl", "fence", "token"}


def _write_app(directory: Path, name: str, conf: dict[str, Any]) -> None:
    (directory / f"{name}.py").write_text(
        textwrap.dedent(f"""\
            from celery import Celery

            app = Celery({name!r})
            app.conf.update({conf!r})
        """)
    )


def _env(directory: Path) -> dict[str, str]:
    # ``directory`` (the app module), then this checkout (tests/conftest.py puts it there).
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _runner(directory: Path, module: str) -> Run:
    env = _env(directory)

    def run(*args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "celery", "-A", module, "redislock", *args]
        return subprocess.run(
            command, cwd=directory, env=env, stdin=stdin, text=True, capture_output=True, timeout=30
        )

    return run


@pytest.fixture
def locks_url(redis_url: str) -> str:
    """URL of the locks database (see workers.py)."""
    return db_url(redis_url, LOCKS_DB)


@pytest.fixture
def run(tmp_path: Path, redis_url: str, locks_url: str, locks: redis.Redis) -> Run:
    """``run(*args)``: the real ``celery -A cliproj redislock *args`` on the test Redis."""
    conf = {"broker_url": db_url(redis_url, BROKER_DB), "redislock_url": locks_url}
    _write_app(tmp_path, "cliproj", conf)
    return _runner(tmp_path, "cliproj")


@pytest.fixture
def invoke(locks_url: str, locks: redis.Redis) -> Iterator[Callable[..., Any]]:
    """``invoke(*args, **conf)``: the click group in-process, on an app with ``conf``."""
    apps: list[Celery] = []

    def call(*args: str, **conf: Any) -> Any:
        app = Celery("cli-inprocess", set_as_current=False)
        app.conf.update(redislock_url=locks_url, **conf)
        apps.append(app)
        obj = CLIContext(app=app, no_color=True, workdir=None)
        return CliRunner().invoke(redislock, list(args), obj=obj)

    yield call
    for app in apps:
        app.close()


@pytest.fixture
def waiter() -> Iterator[Callable[..., None]]:
    """``waiter(primitive, unblock)``: a thread blocked on ``primitive`` until the test
    ends, when ``unblock()`` lets it through (it then releases at once)."""
    started: list[tuple[Callable[[], Any], threading.Thread]] = []

    def start(primitive: RedisLock | RedisSemaphore, unblock: Callable[[], Any]) -> None:
        def wait() -> None:
            lease = primitive.acquire(timeout=15)
            if lease is not None:
                lease.release()

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        started.append((unblock, thread))
        wait_until(lambda: primitive.info().waiters, what="the waiter")

    yield start
    for unblock, thread in started:
        unblock()
        thread.join(20)


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()]


def test_plugin_is_registered_with_celery(run: Run) -> None:
    result = run("--help")  # a plugin that fails to load answers with a warning instead
    assert result.returncode == 0
    assert all(cmd in result.stdout for cmd in ("list", "inspect", "release", "watch"))


def test_list_shows_holders_states_ttl_fences_and_waiters(
    run: Run, locks: redis.Redis, waiter: Callable[[str], None]
) -> None:
    queued = RedisLock(locks, "proj.sync_user:3f2a", ttl=3600).acquire(owner=queued_owner(TASK_A))
    running = RedisLock(locks, "proj.report:9d1c", ttl=30).acquire(owner=running_owner(TASK_B))
    plain = RedisLock(locks, "plain {braces} % lock", ttl=20).acquire()
    sem = RedisSemaphore(locks, "stripe-api", limit=3, ttl=30)
    permits = [sem.acquire(owner=running_owner(TASK_A)), sem.acquire(owner="worker-7")]
    full = RedisSemaphore(locks, "smtp", limit=1, ttl=30)
    smtp = full.acquire(owner="mailer")
    assert queued and running and plain and all(permits) and smtp
    waiter(RedisLock(locks, "proj.report:9d1c"), running.release)
    waiter(full, smtp.release)
    waiter(full, smtp.release)

    result = run("list")
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows[0] == [
        "KIND",
        "NAME",
        "HELD",
        "WAITERS",
        "PARKED",
        "TASK/OWNER",
        "STATE",
        "TTL",
        "FENCE",
    ]
    assert "  plain {braces} % lock  " in result.stdout  # encoded in keys, shown decoded
    assert rows[1][:10] == ["lock", "plain", "{braces}", "%", "lock", "held", "0", "-", "-", "-"]
    assert rows[2][:7] == ["lock", "proj.report:9d1c", "held", "1", "-", TASK_B, "running"]
    assert rows[2][7].endswith("s") and 25 < float(rows[2][7][:-1]) <= 30
    assert rows[2][8] == str(running.fence)
    assert rows[3][:7] == ["lock", "proj.sync_user:3f2a", "held", "0", "-", TASK_A, "queued"]
    assert rows[3][7].startswith("59m")  # a queued task's lease: an hour
    assert rows[4][:7] == ["semaphore", "smtp", "1/1", "2", "0", "mailer", "-"]
    assert rows[5][:7] == ["semaphore", "stripe-api", "2/3", "0", "0", TASK_A, "running"]
    assert rows[6][:2] == ["worker-7", "-"]  # a continuation row: the second permit
    assert len(rows) == 7


def test_a_primitive_with_waiters_only_is_listed(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    # Between a holder's expiry and its waiter's next poll only the waiter keys exist
    # (the queue, and its heartbeat, which info() counts while it has not lapsed).
    keys = KeySpace.build("redislock", "lock", "w")
    seconds, micros = locks.time()
    locks.zadd(keys.queue, {"token": 1})
    locks.zadd(keys.alive, {"token": seconds * 1000 + micros // 1000 + 5000})
    assert _rows(invoke("list").output)[1] == ["lock", "w", "free", "1", "-", "-", "-", "-", "-"]
    refused = invoke("release", "w", "--force", "--yes")
    assert refused.exit_code == 1 and "is not held (1 waiting)" in refused.output


def test_list_kind_filters(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    assert RedisLock(locks, "proj.report:9d1c").acquire()
    assert RedisSemaphore(locks, "stripe-api", limit=3).acquire()
    assert invoke("list", "--kind", "semaphore").output.count("\n") == 2
    only_locks = invoke("list", "--kind", "lock").output
    assert "stripe-api" not in only_locks and "proj.report:9d1c" in only_locks


def test_list_json_has_stable_keys(run: Run, locks: redis.Redis, locks_url: str) -> None:
    started = time.monotonic()
    lease = RedisLock(locks, "proj.report:9d1c", ttl=30).acquire(owner=running_owner(TASK_B))
    sem = RedisSemaphore(locks, "stripe-api", limit=3, ttl=30)
    permit = sem.acquire(owner=queued_owner(TASK_A))
    assert lease and permit

    result = run("list", "--json")
    took = time.monotonic() - started  # on a loaded machine: seconds to start celery
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document) == {"url", "prefix", "server_time", "primitives"}
    assert document["url"] == locks_url and document["prefix"] == "redislock"
    lock, semaphore = document["primitives"]
    assert set(lock) == set(semaphore) == PRIMITIVE_KEYS
    assert set(lock["holders"][0]) == HOLDER_KEYS
    assert lock["kind"] == "lock" and lock["name"] == "proj.report:9d1c"
    assert lock["holders"][0]["task_id"] == TASK_B and lock["holders"][0]["state"] == "running"
    assert lock["holders"][0]["owner"].startswith(TASK_B + "@")
    assert lock["holders"][0]["fence"] == lease.fence == lock["fence"]
    assert lock["holders"][0]["token"] == lease.token[:8]
    # Seconds left of the 30 s lease: at most the time since its acquire has passed.
    assert 30 - took - 0.1 < lock["ttl"] <= 30
    assert lock["limit"] is None and lock["available"] is None
    assert 0 <= document["server_time"] - lock["since"] < took + 0.1
    assert semaphore["kind"] == "semaphore" and semaphore["limit"] == 3
    assert semaphore["available"] == 2 and semaphore["waiters"] == 0
    assert semaphore["holders"][0]["state"] == "queued"


def test_list_of_nothing(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    lease = RedisLock(locks, "gone").acquire()
    assert lease and lease.release()
    assert json.loads(invoke("list", "--json").output)["primitives"] == []
    empty = invoke("list")
    assert empty.exit_code == 0 and "Nothing held or waited for" in empty.output


def test_inspect_shows_one_primitive(run: Run, locks: redis.Redis) -> None:
    lease = RedisLock(locks, "proj.report:9d1c", ttl=30).acquire(owner=running_owner(TASK_B))
    assert lease is not None

    result = run("inspect", "proj.report:9d1c")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("lock 'proj.report:9d1c'\n")
    assert f"(task {TASK_B}, running)" in result.stdout
    assert f"fence     {lease.fence}" in result.stdout
    assert lease.token[:8] in result.stdout and " ago)" in result.stdout


def test_inspect_json_and_semaphores(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    assert RedisLock(locks, "proj.report:9d1c", ttl=30).acquire(owner=running_owner(TASK_B))
    document = json.loads(invoke("inspect", "proj.report:9d1c", "--json").output)
    assert set(document) == {"url", "prefix", "server_time", "primitive"}
    assert set(document["primitive"]) == PRIMITIVE_KEYS
    assert document["primitive"]["holders"][0]["task_id"] == TASK_B

    sem = RedisSemaphore(locks, "stripe-api", limit=2, ttl=30)
    assert sem.acquire(owner="a") and sem.acquire(owner="b")
    sem_view = invoke("inspect", "stripe-api", "--kind", "semaphore").output
    assert "2 leases of limit 2, 0 available; 0 waiters" in sem_view


def test_unknown_name_is_a_clear_error(
    run: Run, invoke: Callable[..., Any], locks_url: str
) -> None:
    result = run("inspect", "no-such-lock")
    assert result.returncode == 3
    assert result.stdout == ""
    assert "no lock or semaphore named 'no-such-lock'" in result.stderr
    assert locks_url in result.stderr
    assert invoke("release", "no-such-lock", "--force", "--yes").exit_code == 3
    assert invoke("inspect", "no-such-lock", "--kind", "semaphore").exit_code == 3


def test_release_by_task_id_or_owner_id_checks_the_owner(run: Run, locks: redis.Redis) -> None:
    lock = RedisLock(locks, "proj.report:9d1c", ttl=30)
    owner = running_owner(TASK_B)
    assert lock.acquire(owner=owner)

    wrong = run("release", "proj.report:9d1c", "--owner", TASK_A)
    assert wrong.returncode == 1 and lock.locked()
    assert f"is not held by '{TASK_A}'" in wrong.stderr and TASK_B in wrong.stderr

    by_task = run("release", "proj.report:9d1c", "--owner", TASK_B)
    assert by_task.returncode == 0, by_task.stderr
    assert "Released lock 'proj.report:9d1c' (1 lease, owner " + owner in by_task.stdout
    assert not lock.locked()


def test_release_by_full_owner_id(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    lock = RedisLock(locks, "proj.report:9d1c", ttl=30)
    owner = running_owner(TASK_B)
    assert lock.acquire(owner=owner) and lock.acquire(owner=owner)  # re-entered: 2 leases
    assert invoke("release", "proj.report:9d1c", "--owner", TASK_B[:8]).exit_code == 1
    by_owner = invoke("release", "proj.report:9d1c", "--owner", owner, "--json")
    assert json.loads(by_owner.output) == {
        "kind": "lock",
        "name": "proj.report:9d1c",
        "released": 2,
        "owners": [owner],
    }
    assert not lock.locked()


def test_release_needs_an_owner_or_force(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    assert RedisLock(locks, "x").acquire()
    neither = invoke("release", "x")
    assert neither.exit_code == 2 and "--owner TASK_ID_OR_OWNER" in neither.output
    both = invoke("release", "x", "--owner", "a", "--force")
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_force_release_asks_first(run: Run, locks: redis.Redis, tmp_path: Path) -> None:
    lock = RedisLock(locks, "stuck", ttl=30)
    assert lock.acquire(owner=running_owner(TASK_A))

    no_tty = run("release", "stuck", "--force")
    assert no_tty.returncode == 1 and lock.locked()
    assert "stdin is not a terminal; pass --yes" in no_tty.stderr

    declined = _run_on_a_terminal(run, b"n\n", "release", "stuck", "--force")
    assert declined.returncode == 1 and lock.locked()
    assert f"held by task {TASK_A}, running" in declined.stderr
    assert "Force-release lock 'stuck'? [y/N]" in declined.stderr

    confirmed = _run_on_a_terminal(run, b"y\n", "release", "stuck", "--force")
    assert confirmed.returncode == 0, confirmed.stderr
    assert "Released lock 'stuck' (1 lease" in confirmed.stdout and not lock.locked()


def test_force_release_with_yes(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    lock = RedisLock(locks, "stuck", ttl=30)
    assert lock.acquire(owner="me") and lock.acquire(owner="me")
    result = invoke("release", "stuck", "--force", "--yes")
    assert result.exit_code == 0 and "(2 leases, owner me)" in result.output
    assert not lock.locked()


def _run_on_a_terminal(run: Run, answer: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    """Run with stdin on a pseudo-terminal that has ``answer`` typed in."""
    primary, secondary = pty.openpty()
    try:
        os.write(primary, answer)
        return run(*args, stdin=secondary)
    finally:
        os.close(secondary)
        os.close(primary)


def test_release_of_a_semaphore(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    sem = RedisSemaphore(locks, "stripe-api", limit=3, ttl=30)
    mine, other = sem.acquire(owner=running_owner(TASK_A)), sem.acquire(owner="other")
    assert mine and other
    result = invoke("release", "stripe-api", "--owner", TASK_A)
    if hasattr(RedisSemaphore, "release_owner"):
        assert result.exit_code == 0, result.output
        assert [h.owner for h in sem.info().holders] == ["other"]
    else:
        assert result.exit_code == 1
        assert "releasing a semaphore by owner is not supported" in result.output
        assert len(sem.info().holders) == 2
    forced = invoke("release", "stripe-api", "--force", "--yes")
    if hasattr(RedisSemaphore, "force_release"):
        assert forced.exit_code == 0 and not sem.info().holders
    else:
        assert forced.exit_code == 1 and "not supported" in forced.output


def test_watch_refreshes_count_times(run: Run, locks: redis.Redis) -> None:
    assert RedisLock(locks, "proj.report:9d1c", ttl=30).acquire(owner=running_owner(TASK_B))
    result = run("watch", "--count", "3", "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout  # not a terminal: no screen clearing
    assert result.stdout.count("1 held or waited for") == 3
    assert result.stdout.count(TASK_B) == 3


def test_watch_json_prints_one_line_per_refresh(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    assert RedisLock(locks, "proj.report:9d1c", ttl=30).acquire()
    lines = invoke("watch", "--count", "2", "--interval", "0.1", "--json").output.splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["primitives"][0]["name"] for line in lines] == ["proj.report:9d1c"] * 2


def _dead_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_redis_names_the_url_with_the_password_masked(
    tmp_path: Path, invoke: Callable[..., Any]
) -> None:
    port = _dead_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    _write_app(tmp_path, "deadproj", {"broker_url": url})
    result = _runner(tmp_path, "deadproj")("list")
    assert result.returncode == 4, result.stderr
    assert f"cannot reach Redis at redis://:**@127.0.0.1:{port}/0" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout and "Traceback" not in result.stderr
    for args in (["inspect", "x"], ["release", "x", "--force", "--yes"], ["watch", "--count", "1"]):
        outcome = invoke("--url", url, *args)
        assert outcome.exit_code == 4, (args, outcome.output)
        assert "cannot reach Redis at redis://:**@" in outcome.output
        assert "s3cret" not in outcome.output


def test_a_broker_that_is_not_redis_needs_redislock_url(
    tmp_path: Path, locks_url: str, locks: redis.Redis
) -> None:
    _write_app(tmp_path, "amqpproj", {"broker_url": "amqp://guest:pw@localhost//"})
    result = _runner(tmp_path, "amqpproj")("list")
    assert result.returncode == 4 and "redislock_url is not set" in result.stderr
    assert "pw@" not in result.stderr

    _write_app(
        tmp_path, "urlproj", {"broker_url": "amqp://localhost//", "redislock_url": locks_url}
    )
    assert RedisLock(locks, "seen").acquire()
    assert "seen" in _runner(tmp_path, "urlproj")("list").stdout


def test_a_running_singleton_task_is_listed_and_released(
    make_app: Any, locks: redis.Redis, worker: Any, run: Run
) -> None:
    """The Celery layer's own owner ids: queued after delay(), running in a worker."""
    app = make_app()
    started, proceed = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, lock_ttl=5)
    def sync_user(user_id: int) -> int:
        started.set()
        proceed.wait(15)
        return user_id

    key = call_key(sync_user, (42,))
    result = sync_user.delay(42)
    queued = json.loads(run("inspect", key, "--json").stdout)["primitive"]["holders"]
    assert [(h["task_id"], h["state"]) for h in queued] == [(result.id, "queued")]

    worker(app)
    assert started.wait(15)
    wait_until(lambda: parse_owner(RedisLock(locks, key).info().owner)[1], what="running")
    listed = run("list")
    assert [key, "held", "0", "-", result.id, "running"] == _rows(listed.stdout)[1][1:7]
    proceed.set()
    assert result.get(timeout=15) == 42
    wait_until(lambda: not RedisLock(locks, key).locked(), what="the release")


# -- in-process (CliRunner): the command's logic ---------------------------------------


def test_a_name_that_is_both_kinds_needs_kind(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    assert RedisLock(locks, "twin").acquire(owner="l")
    assert RedisSemaphore(locks, "twin", limit=1).acquire(owner="s")
    ambiguous = invoke("inspect", "twin")
    assert ambiguous.exit_code == 2 and "both a lock and a semaphore" in ambiguous.output
    assert "holders" in invoke("inspect", "twin", "--kind", "semaphore", "--json").output
    assert invoke("release", "twin", "--kind", "lock", "--owner", "l").exit_code == 0
    assert invoke("inspect", "twin").exit_code == 0  # now only the semaphore is held


def test_prefix_from_the_app_or_the_option(invoke: Callable[..., Any], locks: redis.Redis) -> None:
    assert RedisLock(locks, "mine", prefix="custom").acquire()
    assert RedisLock(locks, "glob", prefix="we*rd?").acquire()
    assert RedisLock(locks, "other", prefix="weXrdY").acquire()
    assert RedisLock(locks, "default").acquire()
    names = lambda result: [p["name"] for p in json.loads(result.output)["primitives"]]  # noqa: E731
    assert names(invoke("list", "--json")) == ["default"]
    assert names(invoke("list", "--json", redislock_prefix="custom")) == ["mine"]
    assert names(invoke("--prefix", "custom", "list", "--json")) == ["mine"]
    assert names(invoke("--prefix", "we*rd?", "list", "--json")) == ["glob"]  # SCAN escapes
    bad = invoke("--prefix", "a{b}", "list")
    assert bad.exit_code == 4 and "--prefix must not contain" in bad.output


def test_url_option_overrides_the_app(
    invoke: Callable[..., Any], locks: redis.Redis, redis_url: str
) -> None:
    assert RedisLock(locks, "in-locks-db").acquire()
    other_db = db_url(redis_url, 0)
    assert "in-locks-db" not in invoke("--url", other_db, "list").output
    assert "in-locks-db" in invoke("list").output
    bad = invoke("--url", "http://:pw@example.com/", "list")
    assert bad.exit_code == 4 and "pw" not in bad.output


def test_watch_reports_a_lost_connection_and_exits_4(invoke: Callable[..., Any]) -> None:
    result = invoke(
        "--url",
        f"redis://127.0.0.1:{_dead_port()}/0",
        "watch",
        "--count",
        "2",
        "--interval",
        "0.1",
        "--json",
    )
    assert result.exit_code == 4
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert len(lines) == 2 and all("cannot reach Redis" in line["error"] for line in lines)


def test_watch_clears_the_screen_on_a_terminal(
    tmp_path: Path, run: Run, locks: redis.Redis
) -> None:
    assert RedisLock(locks, "proj.report:9d1c", ttl=30).acquire()
    primary, secondary = pty.openpty()
    try:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cliproj",
            "redislock",
            "watch",
            "--count",
            "2",
            "--interval",
            "0.1",
        ]
        env = _env(tmp_path)
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=subprocess.PIPE,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        screen = os.read(primary, 65536).decode()
    finally:
        os.close(secondary)
        os.close(primary)
    assert screen.count("\x1b[2J") == 2 and screen.count("proj.report:9d1c") == 2


def test_inspect_a_task_name_lists_its_locks(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    for digest, owner in (("9d1c", running_owner(TASK_A)), ("77aa", queued_owner(TASK_B))):
        assert RedisLock(locks, f"proj.nightly:{digest}", ttl=30).acquire(owner=owner)
    assert RedisLock(locks, "proj.nightly_other:1111", ttl=30).acquire()
    result = invoke("inspect", "proj.nightly")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("task 'proj.nightly': 2 held, waited for or parked")
    assert "proj.nightly:9d1c" in result.output and "proj.nightly:77aa" in result.output
    assert "nightly_other" not in result.output
    document = json.loads(invoke("inspect", "proj.nightly", "--json").output)
    assert document["task"] == "proj.nightly" and len(document["primitives"]) == 2
    assert invoke("inspect", "proj.weekly").exit_code == 3


def test_parked_runs_and_dead_letters_are_shown(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    sem = ParkingSemaphore(locks, "stripe-api", limit=1, ttl=30)
    assert sem.acquire(owner=running_owner(TASK_A))
    sem.park(new_entry_id(), b"RLP1 x y\nrun", owner=TASK_B)
    sem.park(new_entry_id(), b"RLP1 x y\nrun", owner="other-task")
    listed = invoke("list").output.splitlines()
    assert listed[0].split()[4] == "PARKED"
    assert listed[1].split()[4:6] == ["2", "(oldest"]
    document = json.loads(invoke("list", "--json").output)
    assert document["primitives"][0]["parked"] == 2
    assert document["primitives"][0]["oldest_parked"] >= 0
    claimed = sem.pump()  # nothing free: nothing claimed
    assert claimed == (2, [])
    sem.force_release()
    dead = sem.pump()[1][0]
    assert sem.give_back(dead.id, dead="ValueError: not a parked message")
    view = invoke("inspect", "stripe-api").output
    assert "parked    1 (oldest" in view and "+1 dead" in view
    assert f"{dead.id}  " in view and "ValueError: not a parked message" in view


def test_a_permit_a_release_handed_to_a_parked_run_is_shown_reserved_for_it(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    # As the bounded guard parks a run (owner: its task id) and a release hands the
    # freed permit to it: claimed, its message on its way to a worker, not started.
    sem = ParkingSemaphore(locks, "stripe-api", limit=1, ttl=30)
    lease = sem.acquire(owner=running_owner(TASK_A))
    assert lease is not None
    entry_id = new_entry_id()
    assert sem.park(entry_id, b"RLP1 x y\nrun", owner=TASK_B) == 1
    assert lease.release()
    assert sem.parking_info().claimed == 1

    rows = _rows(invoke("list").output)
    assert rows[1][:7] == ["semaphore", "stripe-api", "1/1", "0", "1", TASK_B, "reserved"]
    document = json.loads(invoke("list", "--json").output)
    (holder,) = document["primitives"][0]["holders"]
    assert holder["state"] == "reserved" and holder["task_id"] == TASK_B
    assert holder["token"] == entry_id[:8] and 25 < holder["ttl"] <= 30
    view = invoke("inspect", "stripe-api").output
    assert f"{entry_id[:8]}  {TASK_B}  reserved  " in view

    # The run starts and takes it: its own permit, running.
    status, taken = sem.take(entry_id, running_owner(TASK_B))
    assert status == "granted" and taken is not None
    (holder,) = json.loads(invoke("list", "--json").output)["primitives"][0]["holders"]
    assert holder["state"] == "running" and holder["task_id"] == TASK_B


def test_release_all_asks_then_releases_every_lease(
    invoke: Callable[..., Any], locks: redis.Redis
) -> None:
    leases = [
        RedisLock(locks, name).acquire(owner="t") for name in ("report:1", "report:2", "sync")
    ]
    permit = RedisSemaphore(locks, "report:api", limit=2).acquire()
    other = RedisLock(locks, "report:9", prefix="elsewhere").acquire()
    assert all(leases) and permit and other
    refused = invoke("release", "--all")  # no terminal, no --yes
    assert refused.exit_code == 1 and "without confirmation" in refused.output
    assert all(lease.held() for lease in leases)  # type: ignore[union-attr]
    assert invoke("release", "--all", "report:1").exit_code == 2  # NAME or --all
    assert invoke("release", "report:1", "--match", "x").exit_code == 2
    narrowed = invoke(
        "release", "--all", "--kind", "lock", "--match", "report:*", "--yes", "--json"
    )
    assert narrowed.exit_code == 0, narrowed.output
    assert json.loads(narrowed.output) == {
        "prefix": "redislock",
        "kind": "lock",
        "match": "report:*",
        "released": 2,
    }
    rest = invoke("release", "--all", "--yes")
    assert rest.exit_code == 0 and "Released 2 leases" in rest.output  # sync + the permit
    assert invoke("release", "--all", "--yes").exit_code == 1  # nothing left
    assert other.held()  # another prefix is untouched
