"""A private Sentinel deployment for tests and benchmarks: a primary, its replicas and
the Sentinels that watch them, all ``redis-server`` processes on loopback.

``SentinelGroup()`` starts one primary, two replicas and three Sentinels
(``redis-server --sentinel``) from config files in a temp dir, on free ports, with
``down-after-milliseconds`` 1000 and ``failover-timeout`` 3000, so a SIGKILLed
primary's replica is promoted about 2-2.5 s later. Nothing is kept on disk; leaving
the ``with`` block (or :meth:`stop`) kills every process and removes the dir::

    with SentinelGroup() as group:
        client = group.master_client(socket_timeout=0.5)
        ...
        old = group.kill_primary()          # SIGKILL, as a crash would
        new = group.wait_promoted(old)      # the port every Sentinel now names
        group.restart_node(old)             # back as a replica of the new primary
        group.wait_stable()                 # before the next trial (or: group.heal())

Like :mod:`.testing`, it imports only the standard library and redis-py.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from .testing import _free_port, find_redis_server
from .testing_spawn import HOST as _HOST
from .testing_spawn import log_tail, node_config, sentinel_config, spawn

__all__ = ["SentinelGroup"]


class SentinelGroup:
    """One primary, ``replicas`` replicas and ``sentinels`` Sentinels (context manager).

    ``nodes`` are the data nodes' ports (the first is the initial primary),
    ``sentinel_ports`` the Sentinels'. ``url`` is the Celery/kombu form
    ``sentinel://127.0.0.1:P1;sentinel://127.0.0.1:P2;...``.
    """

    def __init__(
        self,
        replicas: int = 2,
        sentinels: int = 3,
        *,
        master_name: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        executable: str | None = None,
    ) -> None:
        self.executable = executable or find_redis_server()
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.nodes = [_free_port() for _ in range(replicas + 1)]
        self.sentinel_ports = [_free_port() for _ in range(sentinels)]
        self.quorum = sentinels // 2 + 1
        self._dir = tempfile.mkdtemp(prefix="redislock-sentinel-")
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every Sentinel, as ``redis.sentinel.Sentinel`` takes them."""
        return [(_HOST, port) for port in self.sentinel_ports]

    @property
    def url(self) -> str:
        """The Sentinels as a Celery/kombu ``sentinel://`` URL list."""
        return ";".join(f"sentinel://{_HOST}:{port}" for port in self.sentinel_ports)

    # -- life cycle -------------------------------------------------------------------

    def start(self, ready_timeout: float = 30.0) -> SentinelGroup:
        """Start every process; return once the Sentinels agree on the primary and it
        has all its replicas online."""
        primary = self.nodes[0]
        for port in self.nodes:
            self._start_node(port, None if port == primary else primary)
        for port in self.sentinel_ports:
            self._start_sentinel(port, primary)
        self.wait_stable(ready_timeout)
        return self

    def stop(self) -> None:
        """SIGKILL every process still running (paused ones too) and wait for it."""
        for port in list(self._processes):
            self.kill_node(port)

    def __enter__(self) -> SentinelGroup:
        try:
            return self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- clients ----------------------------------------------------------------------

    def sentinel(self, **kwargs: Any) -> Any:
        """A ``redis.sentinel.Sentinel`` on every Sentinel; ``kwargs`` go to the data
        nodes' connections (short timeouts suit tests that kill servers)."""
        sentinel_kwargs = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
        return Sentinel(self.sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs)  # type: ignore[no-untyped-call]

    def master_client(self, **kwargs: Any) -> Any:
        """``Sentinel(...).master_for(master_name)``: follows failovers by itself."""
        return self.sentinel(**kwargs).master_for(self.master_name)

    def node_client(self, port: int, timeout: float = 2.0) -> Any:
        """A plain client of one data node (or Sentinel), without redis-py's retries:
        a paused node must cost one ``timeout``, not eleven."""
        return redis.Redis(
            host=_HOST,
            port=port,
            socket_timeout=timeout,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )

    # -- faults -----------------------------------------------------------------------

    def primary_port(self) -> int | None:
        """The port every Sentinel names as primary, in the answer redis-py's Sentinel
        client reads (``SENTINEL MASTERS``: not down, no failover in progress), and
        that node says it is one; None while they disagree or none is elected.

        ``SENTINEL get-master-addr-by-name`` names a promoted replica before the
        failover ends, while ``SENTINEL MASTERS`` still names the old primary, not
        down if it came back: a client asking then reaches the old primary."""
        named: set[int | None] = set()
        for sentinel_port in self.sentinel_ports:
            client = self.node_client(sentinel_port, 0.5)
            try:
                state = client.sentinel_master(self.master_name)
            except redis.RedisError:
                return None
            finally:
                client.close()
            settled = state.get("is_master") and not (
                state.get("is_sdown")
                or state.get("is_odown")
                or "failover_in_progress" in str(state.get("flags", ""))
            )
            named.add(int(state["port"]) if settled else None)
        if len(named) != 1:
            return None
        (port,) = named
        return port if port is not None and self.role(port) == "master" else None

    def kill_node(self, port: int) -> None:
        """SIGKILL one process (data node or Sentinel), as a crash would."""
        process = self._processes.pop(port, None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def pause_node(self, port: int) -> None:
        """SIGSTOP one process: alive but silent, as a partitioned or frozen server."""
        self._processes[port].send_signal(signal.SIGSTOP)

    def resume_node(self, port: int) -> None:
        """SIGCONT a paused process."""
        self._processes[port].send_signal(signal.SIGCONT)

    def role(self, port: int) -> str:
        """``master``, ``slave`` or ``down`` (no answer): the node's own view."""
        return str(self._role(port)[0])

    def kill_primary(self) -> int:
        """SIGKILL the current primary; return its port."""
        port = self.primary_port()
        if port is None:
            raise RuntimeError("no agreed primary to kill")
        self.kill_node(port)
        return port

    def restart_node(self, port: int) -> None:
        """Start a killed data node again, empty, as a replica of the current primary."""
        primary = self.primary_port()
        if primary is None:
            raise RuntimeError("no agreed primary to replicate")
        self._start_node(port, primary)

    def heal(self, timeout: float = 60.0) -> int:
        """Resume paused nodes, start killed data nodes again as replicas (once a
        replica took over), and :meth:`wait_stable`; return the primary's port."""
        for process in self._processes.values():
            process.send_signal(signal.SIGCONT)  # a no-op unless paused
        for port in self.nodes:
            if port not in self._processes:
                self.wait_promoted(port, timeout)
                self.restart_node(port)
        return self.wait_stable(timeout)

    def wait_promoted(self, old: int, timeout: float = 30.0) -> int:
        """Wait until every Sentinel names a primary other than ``old``; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old:
                return port
            time.sleep(0.05)
        raise TimeoutError(f"no replica promoted within {timeout}s after killing {old}")

    def wait_stable(self, timeout: float = 30.0, settle: float = 1.0) -> int:
        """Wait until the Sentinels agree on a primary for ``settle`` s, it has every
        running data node online as a replica, and a write reaches them all (WAIT);
        return its port. Back-to-back failovers can split the vote or let a Sentinel
        still finishing the last one promote the wrong node, so trials wait here."""
        deadline = time.monotonic() + timeout
        agreed_since: tuple[int, float] | None = None
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is None or (agreed_since is not None and agreed_since[0] != port):
                agreed_since = None
            elif agreed_since is None:
                agreed_since = (port, time.monotonic())
            if (
                agreed_since is not None
                and port is not None
                and time.monotonic() - agreed_since[1] >= settle
                and self._replicas_online(port)
            ):
                return port
            time.sleep(0.05)
        raise TimeoutError(f"the Sentinel group did not settle within {timeout}s")

    # -- internals --------------------------------------------------------------------

    def _replicas_online(self, primary: int) -> bool:
        expected = sum(1 for port in self._processes if port in self.nodes) - 1
        client = self.node_client(primary)
        try:
            role = client.execute_command("ROLE")
            online = [r for r in role[2] if int(r[1]) in self.nodes]
            if len(online) < expected:
                return False
            client.set("__redislock_sentinel_probe__", "1")
            # The first WAIT after a full sync can take ~0.9 s (REDIS-FACTS).
            return int(client.execute_command("WAIT", expected, 2000)) >= expected
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _role(self, port: int) -> list[str]:
        client = self.node_client(port, 0.5)
        try:
            role = client.execute_command("ROLE")
            return [role[0].decode() if isinstance(role[0], bytes) else role[0]]
        except redis.RedisError:
            return ["down"]
        finally:
            client.close()

    def _start_node(self, port: int, primary: int | None) -> None:
        lines = node_config(port, self._dir, primary)
        self._processes[port] = spawn(self.executable, self._dir, port, lines, sentinel=False)

    def _start_sentinel(self, port: int, primary: int) -> None:
        lines = sentinel_config(
            port,
            self._dir,
            self.master_name,
            primary,
            self.quorum,
            self.down_after_ms,
            self.failover_timeout_ms,
        )
        self._processes[port] = spawn(self.executable, self._dir, port, lines, sentinel=True)

    def log_tail(self, port: int, lines: int = 20) -> str:
        """The last lines of one process's log, for error messages."""
        return log_tail(self._dir, port, lines)
