"""Helpers of :mod:`.testing_cluster` about single cluster nodes: a ``redis-server``'s
version, a free port whose cluster bus port is free too, ``CLUSTER NODES`` by port.

Like :mod:`celery_redislock.testing`, this imports only the standard library and redis-py.
"""

from __future__ import annotations

import re
import socket
import subprocess
from typing import Any

from .testing import _free_port

__all__ = ["BUS_OFFSET", "node_table", "port_with_bus", "version"]

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
