"""Helpers of :mod:`.testing_cluster` about single cluster nodes: a ``redis-server``'s
version, a free port whose cluster bus port is free too, ``CLUSTER NODES`` by port, and
what one node says of the cluster (does it know every node, its slot map when healthy).

Like :mod:`celery_redislock.testing`, this imports only the standard library and redis-py.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable, Set
from typing import Any

import redis

from .testing import _free_port

__all__ = [
    "BUS_OFFSET",
    "knows_all",
    "node_table",
    "port_with_bus",
    "slot_view",
    "version",
    "wait_for",
]

BUS_OFFSET = 10000
"""Redis < 7: a node's cluster bus port is its port + 10000."""


def version(executable: str) -> tuple[int, ...]:
    """The version of a ``redis-server`` binary, e.g. (7, 0, 15)."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out.stdout)
    return tuple(int(part) for part in match.groups()) if match else (0,)


def port_with_bus() -> int:
    """A free port whose bus port (+10000) is free too."""
    while True:
        port = _free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


def node_table(client: Any) -> dict[int, dict[str, Any]]:
    """``CLUSTER NODES`` as redis-py parses it (``node_id``, ``flags``, ``master_id``,
    ``slots``: [[first, last]], ...), by port."""
    table = client.execute_command("CLUSTER NODES")
    return {int(address.rsplit(":", 1)[1]): row for address, row in table.items()}


def knows_all(client: Any, count: int) -> bool:
    """True when the node of ``client`` knows ``count`` nodes, none still joining."""
    table = node_table(client)
    return len(table) == count and not any(
        "handshake" in row["flags"] or "noaddr" in row["flags"] for row in table.values()
    )


def slot_view(
    client: Any, port: int, running: Set[int], primaries: int
) -> tuple[tuple[int, str], ...] | None:
    """The slot map (each primary's port and slot ranges) of the node on ``port``, as
    its ``client`` (``decode_responses=True``) reads it, or None while it is not ok,
    sees a ``running`` node failed or joining, has not ``primaries`` primaries, or is a
    replica not yet in sync. Nodes that do not run (killed) are left out."""
    try:
        if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            return None
        rows = {p: row for p, row in node_table(client).items() if p in running}
        if len(rows) != len(running) or any(
            flag in row["flags"]
            for row in rows.values()
            for flag in ("fail", "handshake", "noaddr")
        ):
            return None
        myself = rows[port]
        if "slave" in myself["flags"] and (
            myself["master_id"] == "-"
            or client.info("replication").get("master_link_status") != "up"
        ):
            return None
        serving = {p: row for p, row in rows.items() if "master" in row["flags"] and row["slots"]}
        if len(serving) != primaries:
            return None
        return tuple(sorted((p, repr(row["slots"])) for p, row in serving.items()))
    except redis.RedisError:
        return None


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it is true; RuntimeError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
