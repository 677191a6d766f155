"""Processes of :mod:`.testing_sentinel`: the config of a data node or a Sentinel, a
``redis-server`` started from it (waited for until it answers), and its log's tail.

Like :mod:`.testing`, it imports only the standard library and redis-py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["HOST", "log_tail", "node_config", "sentinel_config", "spawn"]

HOST = "127.0.0.1"
"""Every process listens on loopback only."""


def node_config(port: int, directory: str, primary: int | None) -> list[str]:
    """The config lines of a data node (a replica of ``primary`` unless None)."""
    lines = [
        f"port {port}",
        f"bind {HOST}",
        'save ""',
        "appendonly no",
        f"dir {directory}",
        f"dbfilename dump-{port}.rdb",
        f"logfile {directory}/redis-{port}.log",
        "loglevel notice",
        "repl-diskless-sync yes",
        "repl-diskless-sync-delay 0",
    ]
    if primary is not None:
        lines.append(f"replicaof {HOST} {primary}")
    return lines


def sentinel_config(
    port: int,
    directory: str,
    name: str,
    primary: int,
    quorum: int,
    down_after_ms: int,
    failover_timeout_ms: int,
) -> list[str]:
    """The config lines of a Sentinel watching ``primary`` as ``name``."""
    return [
        f"port {port}",
        f"bind {HOST}",
        f"dir {directory}",
        f"logfile {directory}/sentinel-{port}.log",
        "loglevel notice",
        "sentinel resolve-hostnames no",
        f"sentinel monitor {name} {HOST} {primary} {quorum}",
        f"sentinel down-after-milliseconds {name} {down_after_ms}",
        f"sentinel failover-timeout {name} {failover_timeout_ms}",
        f"sentinel parallel-syncs {name} 2",
    ]


def spawn(
    executable: str, directory: str, port: int, lines: list[str], *, sentinel: bool
) -> subprocess.Popen[bytes]:
    """Start ``redis-server`` (``--sentinel``) from ``lines`` and wait until it answers."""
    # A Sentinel rewrites its config file: each process gets its own.
    path = os.path.join(directory, f"{'sentinel' if sentinel else 'redis'}-{port}.conf")
    with open(path, "w") as config:
        config.write("\n".join(lines) + "\n")
    args = [executable, path, *(["--sentinel"] if sentinel else [])]
    # A session of its own, as RedisServer: a Ctrl-C to the caller kills nothing.
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 15
    client = redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=0.5,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return process
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()  # not handed to the caller: it must not outlive this
                process.wait()
                raise RuntimeError(f"{path} did not start: {log_tail(directory, port)}")
            time.sleep(0.02)
    finally:
        client.close()


def log_tail(directory: str, port: int, lines: int = 20) -> str:
    """The last lines of one process's log, for error messages."""
    for kind in ("redis", "sentinel"):
        with contextlib.suppress(OSError), open(f"{directory}/{kind}-{port}.log") as log:
            return "".join(log.readlines()[-lines:])
    return ""
