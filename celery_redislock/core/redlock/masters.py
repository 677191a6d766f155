"""The Redlock masters: one :class:`Master` per client, and :func:`fan_out`, which runs
one script on every master at once from the calling thread.

A fan-out writes the request to every master first and then reads the replies as
they arrive (``select`` over the sockets), so its latency is the slowest master's
round trip, not the sum, and it costs no thread hand-off. Measured on the
development machines (benchmarks/bench_redlock.py): a thread pool per call cost
about 3x this, and taking a connection from redis-py's pool per master about 1.5x
(the pool checks each connection for unread data with a ``recv`` on the way out).
So each :class:`Master` keeps connections of its own, made from its client's
settings, one per thread in flight.

A master that does not answer before the call's deadline, or fails, is reported
as its exception; its connection is closed (a late reply must never be read as the
answer to a later request).
"""

from __future__ import annotations

import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ...errors import ConfigurationError
from ..lease import current_pid
from ..scripts import LuaScript, StaleReply, as_text

__all__ = ["IO_TIMEOUT", "Call", "Master", "check_masters", "fan_out", "server_label"]

IO_TIMEOUT = 1.0
"""Longest socket wait, in seconds, of a master's own connections (connect, and the
handshake of a new connection, which redis-py does synchronously): a stopped or
unreachable master delays a call by at most this much. A fan-out's replies are
awaited only until its own deadline."""

class Call:
    """One master's request: the script, its KEYS and its ARGV, packed once (the
    same bytes go to every master that gets the same request)."""

    __slots__ = ("args", "keys", "packed", "script")

    def __init__(self, script: LuaScript, keys: Sequence[bytes], args: Sequence[Any],
                 packed: bytes | None = None) -> None:  # fmt: skip
        self.script = script
        self.keys = keys
        self.args = [_bytes(arg) for arg in args]
        self.packed = packed if packed is not None else _resp(
            [b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *keys, *self.args])

    @classmethod
    def family(cls, script: LuaScript, keys: Sequence[bytes],
               args: Sequence[Any]) -> Callable[[bytes], Call]:  # fmt: skip
        """A maker of the calls that differ only by one more, last key (a master's
        own): everything else is packed once."""
        encoded = [_bytes(arg) for arg in args]
        count = 3 + len(keys) + 1 + len(encoded)
        head = b"*%d\r\n" % count + _resp(
            [b"EVALSHA", script.sha.encode(), b"%d" % (len(keys) + 1), *keys], header=False)
        tail = _resp(encoded, header=False)

        def make(last: bytes) -> Call:
            return cls(script, [*keys, last], encoded,
                       head + b"$%d\r\n%s\r\n" % (len(last), last) + tail)  # fmt: skip

        return make


def _resp(parts: Sequence[bytes], header: bool = True) -> bytes:
    # RESP, as redis-py's packer writes it, without its per-argument encoder calls
    # (measured: half the client CPU of a fan-out).
    body = b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)
    return b"*%d\r\n" % len(parts) + body if header else body


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    raise TypeError(f"cannot send {value!r} to Redis")


MakeCall = Callable[[int, str], Call]
"""Builds the request for master ``index`` whose server has run id ``run_id``."""


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

    def give_back(self, conn: Any) -> None:
        """Return a connection whose reply was read in full."""
        self._idle.append(conn)

    def _on_connect(self, conn: Any) -> None:
        # Every (re)connect learns the server's run id: a restarted server has a new
        # one, so its boot marker (named after it) is missing there. Kept on the
        # connection: a live connection always talks to the server it connected to.
        conn.send_command("INFO", "server", check_health=False)
        info = as_text(conn.read_response(disable_decoding=True))
        conn.redlock_run_id = ""
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
        raise ConfigurationError(
            f"clients must be a list of redis.Redis clients, got {clients!r}"
        )
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


def fan_out(masters: Sequence[Master], make_call: MakeCall, timeout: float) -> list[Any]:
    """Run ``make_call(i, run_id)`` on ``masters[i]``, all at once; wait until every
    master answered or ``timeout`` seconds passed since the last was sent (a new
    connection's handshake comes before its request and is bounded by
    :data:`IO_TIMEOUT`).

    Returns one entry per master: its reply, or the exception it answered with (a
    ``RedisError``; a ``redis.TimeoutError`` when it did not answer in time).
    A NOSCRIPT reply is answered by sending the script itself on the same connection.
    """
    results: list[Any] = [None] * len(masters)
    conns: list[Any] = [None] * len(masters)
    calls: dict[int, Call] = {}
    pending: dict[Any, int] = {}
    for index, master in enumerate(masters):
        conn = conns[index] = master.take()
        try:
            if conn._sock is None:
                conn.connect()  # first: the request may name the server's run id
            call = calls[index] = make_call(index, conn.redlock_run_id)
            conn.send_packed_command([call.packed], check_health=False)
        except (RedisError, OSError) as exc:
            results[index] = _failed(conn, exc)
            conns[index] = None
            continue
        # The connection's socket: the one thing select() needs (redis-py keeps it in
        # ``_sock``; it is set once send_command connected).
        pending[conn._sock] = index
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        ready = select.select(list(pending), [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            for index in pending.values():
                results[index] = _failed(conns[index], RedisTimeoutError(
                    f"{masters[index].label} did not answer within the call's deadline"))
                conns[index] = None
            break
        for sock in ready:
            index = pending.pop(sock)
            conn = conns[index]
            try:
                call = calls[index]
                results[index] = call.script.checked(conn.read_response(), call.args)
            except StaleReply as exc:  # another command's reply: never use it again
                results[index] = _failed(conn, exc)
                conns[index] = None
            except NoScriptError:
                call = calls[index]
                try:
                    conn.send_command("EVAL", call.script.text, len(call.keys), *call.keys,
                                      *call.args, check_health=False)  # fmt: skip
                except (RedisError, OSError) as exc:
                    results[index] = _failed(conn, exc)
                    conns[index] = None
                else:
                    pending[conn._sock] = index
            except RedisError as exc:  # a script error: the connection is clean
                results[index] = exc
                if not isinstance(exc, RedisTimeoutError) and conn._sock is not None:
                    continue
                results[index] = _failed(conn, exc)
                conns[index] = None
            except OSError as exc:
                results[index] = _failed(conn, exc)
                conns[index] = None
    for master, conn in zip(masters, conns, strict=True):
        if conn is not None and conn._sock is not None:
            master.give_back(conn)
    return results


def _failed(conn: Any, exc: BaseException) -> BaseException:
    conn.disconnect()
    return exc
