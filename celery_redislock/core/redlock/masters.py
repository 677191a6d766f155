"""The Redlock masters: one :class:`Master` per client, with connections of its own.

Each :class:`Master` keeps connections made from its client's settings (one per
thread in flight), so a fan-out (:mod:`.fanout`) takes one per master without going
through redis-py's pool (which checks each connection for unread data with a
``recv`` on the way out), and a connection can be given back with replies still due
(see :mod:`.wire`). Every (re)connect learns the server's run id.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from typing import Any, ClassVar

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from ...errors import ConfigurationError
from ..lease import current_pid
from ..scripts import as_text
from . import wire

__all__ = [
    "IO_TIMEOUT",
    "RECONNECT_MAX",
    "RECONNECT_MIN",
    "Master",
    "check_masters",
    "server_label",
]

IO_TIMEOUT = 1.0
"""Longest socket wait, in seconds, of a master's own connections (connect, and the
handshake of a new connection, which redis-py does synchronously): a stopped or
unreachable master delays a call by at most this much. A fan-out's replies are
awaited only until its own deadline."""

RECONNECT_MIN = 0.05
"""Seconds a master is not reconnected to after its first failed connect (then
doubled on each failure, with jitter, up to :data:`RECONNECT_MAX`)."""

RECONNECT_MAX = 0.5
"""Longest backoff between connects to a master that is down: it is back in use at
most this long after it is."""


class Master:
    """One independent Redis master of a Redlock: its client, its own connections,
    its server's run id (learned on every connect; a restart changes it)."""

    _registry: ClassVar[weakref.WeakKeyDictionary[Any, Master]] = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    @classmethod
    def for_client(cls, client: Any) -> Master:
        """The process's :class:`Master` for ``client`` (shared by every lock on it)."""
        master = cls._registry.get(client)
        if master is None:
            with cls._registry_lock:
                master = cls._registry.get(client)
                if master is None:
                    master = cls._registry[client] = cls(client)
        return master

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = client.connection_pool
        self._make = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        # No retry of its own (a master that fails counts as not answering; the next
        # call tries again) and bounded socket waits, whatever the client's settings.
        self._kwargs["retry"] = Retry(NoBackoff(), 0)
        for option in ("socket_timeout", "socket_connect_timeout"):
            self._kwargs[option] = min(self._kwargs.get(option) or IO_TIMEOUT, IO_TIMEOUT)
        self.label = server_label(client)
        self._idle: list[Any] = []
        self._backoff = 0.0  # seconds: after a failed connect, doubled on each failure
        self._retry_at = 0.0  # time.monotonic() before which no connect is tried
        self._pid = current_pid()
        weakref.finalize(self, _close_all, self._idle)

    def take(self) -> Any:
        """A connection of this master for one request (made on demand)."""
        if self._pid != current_pid():  # a forked child never uses its parent's sockets
            self._idle, self._pid = [], current_pid()
        try:
            return self._idle.pop()
        except IndexError:
            conn = self._make(**self._kwargs)
            conn.register_connect_callback(self._on_connect)
            return conn

    def connect(self, conn: Any) -> None:
        """Connect ``conn`` (its handshake learns the run id), unless a connect failed
        less than the backoff ago: then raise ``ConnectionError`` at once. A master
        that is down costs a round a refused connect at most every
        :data:`RECONNECT_MAX` seconds -- or a whole connect timeout (up to
        :data:`IO_TIMEOUT`) when it is unreachable -- not one per round."""
        now = time.monotonic()
        if now < self._retry_at:
            raise RedisConnectionError(
                f"{self.label}: reconnecting in {self._retry_at - now:.3f}s (backoff)"
            )
        try:
            conn.connect()
        except BaseException:
            self._backoff = min(max(self._backoff * 2, RECONNECT_MIN), RECONNECT_MAX)
            self._retry_at = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
            raise
        self._backoff = self._retry_at = 0.0

    def give_back(self, conn: Any) -> None:
        """Return a connection (maybe with replies still due: see :mod:`.wire`)."""
        self._idle.append(conn)

    def _on_connect(self, conn: Any) -> None:
        # Every (re)connect learns the server's run id: a restarted server has a new
        # one, so its boot marker (named after it) is missing there. Kept on the
        # connection: a live connection always talks to the server it connected to.
        conn.send_command("INFO", "server", check_health=False)
        info = as_text(conn.read_response(disable_decoding=True))
        conn.redlock_run_id = ""
        wire.reset(conn)
        for line in info.splitlines():
            if line.startswith("run_id:"):
                conn.redlock_run_id = line[7:].strip()

    def __repr__(self) -> str:
        return f"<Master {self.label}>"


def _close_all(conns: list[Any]) -> None:
    for conn in conns:
        conn.disconnect()


def server_label(client: Any) -> str:
    """``host:port`` (or the socket path) of a client's server, for messages and for
    telling two masters apart."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    host = str(kwargs.get("host", "localhost")).lower()
    if host in ("localhost", "::1", "0.0.0.0"):
        host = "127.0.0.1"
    return f"{host}:{kwargs.get('port', 6379)}"


def check_masters(clients: object) -> list[Master]:
    """The masters of ``clients``: a list of at least 3 ``redis.Redis``, an odd number,
    each naming a different server; else :class:`ConfigurationError` naming the value."""
    if isinstance(clients, (str, bytes)) or not isinstance(clients, (list, tuple)):
        raise ConfigurationError(f"clients must be a list of redis.Redis clients, got {clients!r}")
    for client in clients:
        if not isinstance(client, Redis):
            raise ConfigurationError(
                f"clients must be redis.Redis clients of independent masters, got {client!r}"
            )
    if len(clients) < 3 or len(clients) % 2 == 0:
        raise ConfigurationError(
            f"clients must name an odd number of at least 3 masters (a majority must "
            f"survive the loss of a minority), got {len(clients)}: "
            f"{[server_label(client) for client in clients]}"
        )
    seen: dict[str, int] = {}
    for index, client in enumerate(clients):
        label = server_label(client)
        if label in seen:
            raise ConfigurationError(
                f"clients[{seen[label]}] and clients[{index}] name the same server "
                f"{label!r}: Redlock needs independent masters"
            )
        seen[label] = index
    return [Master.for_client(client) for client in clients]
