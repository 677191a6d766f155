"""The Redlock masters: one :class:`Master` per client, with connections of its own.

Each :class:`Master` keeps redis-py connections made from its client's settings (one
per thread in flight), each wrapped in a :class:`Link` that holds what is ours about
it: the calls sent on it whose replies are still to be read (a round may end before
a slow master answered, see :mod:`.fanout`) and the run id of the server it is
connected to (learned on every connect). A fan-out takes one link per master without
going through redis-py's pool (which checks each connection for unread data on the
way out, and would refuse one that still owes replies).
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, cast

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from redis.typing import EncodableT, KeyT

from ...errors import ConfigurationError
from ..lease import current_pid
from ..scripts import LuaScript, as_text

__all__ = [
    "IO_TIMEOUT",
    "RECONNECT_MAX",
    "RECONNECT_MIN",
    "Call",
    "Connection",
    "Due",
    "Link",
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


class Connection(Protocol):
    """What a link uses of a redis-py ``Connection`` (its public methods, which
    redis-py leaves untyped)."""

    def register_connect_callback(self, callback: Callable[[Connection], None]) -> None: ...

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def can_read(self, timeout: float = 0) -> bool: ...

    def pack_command(self, *args: EncodableT) -> list[bytes]: ...

    def send_command(self, *args: EncodableT, check_health: bool = True) -> None: ...

    def send_packed_command(self, command: list[bytes], check_health: bool = True) -> None: ...

    def read_response(self, disable_decoding: bool = False) -> object: ...


@dataclass(frozen=True, slots=True)
class Call:
    """One script call of a round: the same KEYS and ARGV on every master, except
    where ``keys_for`` gives a master's KEYS from its server's run id (an acquire
    names the server's boot marker)."""

    script: LuaScript
    keys: list[KeyT]
    args: list[EncodableT]
    keys_for: Callable[[str], list[KeyT]] | None = None
    packed: dict[tuple[str, str], list[bytes]] = field(default_factory=dict, compare=False)
    """The request as sent, by the masters' encoding: packed once when it is the same
    for every master (the CPU a fan-out costs is N times a request's)."""


@dataclass(frozen=True, slots=True)
class Due:
    """A call sent on a link whose reply is still to be read: the KEYS it was sent
    with (sent again as ``EVAL`` after a NOSCRIPT), and when its reply is overdue."""

    call: Call
    keys: list[KeyT]
    expires: float


class Link:
    """One connection of a master and what is ours about it (never stored on
    redis-py's object): the calls it owes replies to, oldest first (Redis answers a
    connection's requests in order), and its server's run id."""

    __slots__ = ("__weakref__", "conn", "connected", "due", "run_id")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.due: deque[Due] = deque()
        self.run_id = ""
        self.connected = False
        conn.register_connect_callback(self._on_connect)  # kept weakly by redis-py

    def _on_connect(self, conn: Connection) -> None:
        # Every (re)connect learns the server's run id: a restarted server has a new
        # one, so its boot marker (named after it) is missing there. A new connection
        # owes nothing.
        conn.send_command("INFO", "server", check_health=False)
        info = as_text(conn.read_response(disable_decoding=True))
        self.run_id = ""
        for line in info.splitlines():
            if line.startswith("run_id:"):
                self.run_id = line[7:].strip()
        self.due.clear()
        self.connected = True

    def drop(self) -> None:
        """Close the connection (it failed, timed out or answered out of order): a
        late reply must never be read as the answer to a later request. It connects
        again on its next use."""
        self.connected = False
        self.due.clear()
        self.conn.disconnect()


class Master:
    """One independent Redis master of a Redlock: its client, its own connections,
    the backoff of its connects."""

    _registry: ClassVar[weakref.WeakKeyDictionary[Redis, Master]] = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    @classmethod
    def for_client(cls, client: Redis) -> Master:
        """The process's :class:`Master` for ``client`` (shared by every lock on it)."""
        master = cls._registry.get(client)
        if master is None:
            with cls._registry_lock:
                master = cls._registry.get(client)
                if master is None:
                    master = cls._registry[client] = cls(client)
        return master

    def __init__(self, client: Redis) -> None:
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
        self.encoding: tuple[str, str] = (
            self._kwargs.get("encoding", "utf-8"),
            self._kwargs.get("encoding_errors", "strict"),
        )
        self._idle: list[Link] = []
        self._backoff = 0.0  # seconds: after a failed connect, doubled on each failure
        self._retry_at = 0.0  # time.monotonic() before which no connect is tried
        self._pid = current_pid()
        weakref.finalize(self, _close_all, self._idle)

    def take(self) -> Link:
        """A link of this master for one request (made on demand, not connected)."""
        if self._pid != current_pid():  # a forked child never uses its parent's sockets
            self._idle, self._pid = [], current_pid()
        try:
            return self._idle.pop()
        except IndexError:
            return Link(cast(Connection, self._make(**self._kwargs)))

    def connect(self, link: Link) -> None:
        """Connect ``link`` (its handshake learns the run id), unless a connect failed
        less than the backoff ago: then raise ``ConnectionError`` at once. A master
        that is down costs a round a refused connect at most every
        :data:`RECONNECT_MAX` seconds -- or a whole connect timeout (up to
        :data:`IO_TIMEOUT`) when it is unreachable -- not one per round."""
        now = time.monotonic()
        if now < self._retry_at:
            raise RedisConnectionError(
                f"{self.label}: reconnecting in {self._retry_at - now:.3f}s (backoff)"
            )
        link.drop()
        try:
            link.conn.connect()
            if not link.connected:  # a handshake that did not reach our callback
                raise RedisConnectionError(f"{self.label}: connected without a handshake")
        except BaseException:
            link.drop()
            self._backoff = min(max(self._backoff * 2, RECONNECT_MIN), RECONNECT_MAX)
            self._retry_at = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
            raise
        self._backoff = self._retry_at = 0.0

    def give_back(self, link: Link) -> None:
        """Return a link (maybe owing replies, or closed: connected on its next use)."""
        self._idle.append(link)

    def __repr__(self) -> str:
        return f"<Master {self.label}>"


def _close_all(links: list[Link]) -> None:
    for link in links:
        link.conn.disconnect()


def server_label(client: Redis) -> str:
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
    masters: list[Redis] = []
    for client in clients:
        if not isinstance(client, Redis):
            raise ConfigurationError(
                f"clients must be redis.Redis clients of independent masters, got {client!r}"
            )
        masters.append(client)
    if len(masters) < 3 or len(masters) % 2 == 0:
        raise ConfigurationError(
            f"clients must name an odd number of at least 3 masters (a majority must "
            f"survive the loss of a minority), got {len(masters)}: "
            f"{[server_label(client) for client in masters]}"
        )
    seen: dict[str, int] = {}
    for index, client in enumerate(masters):
        label = server_label(client)
        if label in seen:
            raise ConfigurationError(
                f"clients[{seen[label]}] and clients[{index}] name the same server "
                f"{label!r}: Redlock needs independent masters"
            )
        seen[label] = index
    return [Master.for_client(client) for client in masters]
