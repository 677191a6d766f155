"""One connection per client and thread, kept out of the pool between script calls.

redis-py's pool costs every command a lock, metrics and three system calls in
``get_connection``/``release`` (a non-blocking peek at the socket between two
``settimeout`` calls). On the machines measured that was more client time than the
rest of a lock's script call (``benchmarks/bench_lock.py``: an uncontended cycle
1.40x of the floor through the pool, 1.01x-1.03x with a kept connection). A thread
that calls scripts keeps the connection it first took instead and gives it back to
the pool when the thread ends (or the client goes).

Only where that cannot change what the user sees: a plain ``ConnectionPool`` (not
Sentinel's, whose connections follow the primary; not a ``BlockingConnectionPool``,
whose size is a bound the user chose), without client-side caching, and at most a
quarter of the pool's ``max_connections`` kept per client (other threads, and other
commands of the same thread, always find the rest). A call made while the thread's
connection is busy (a nested call, from a signal handler) and a forked child's first
call take a connection from the pool as before. A connection idle for a second is
checked as the pool checks it (the server may have closed it) before it is used.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from redis.connection import Connection, ConnectionPool

if TYPE_CHECKING:
    from redis import Redis
    from redis.retry import Retry

__all__ = ["Kept", "ScriptConnection", "kept_connection", "sees_resends"]


class ScriptConnection(Protocol):
    """What a script call uses of a redis-py connection: its public methods (typed
    here; redis-py leaves them untyped) and its timeouts (constructor options)."""

    socket_timeout: float | None
    socket_connect_timeout: float | None
    retry: Retry

    def send_command(self, *args: Any) -> None: ...
    def can_read(self, timeout: float = 0) -> bool: ...
    def read_response(self) -> Any: ...
    def disconnect(self) -> None: ...
    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None: ...


IDLE_CHECK = 1.0
"""Seconds a kept connection may sit unused before it is checked before use."""


class _Client:
    """What is kept for one client: its threads' connections and how many there are."""

    __slots__ = ("count", "limit", "local", "lock")

    def __init__(self, limit: int) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.count = 0
        self.limit = limit


class Kept:
    """A thread's kept connection: ``conn``, taken from ``pool`` by process ``pid``.

    ``connected``: False once a call on it failed or was interrupted (the call closed
    it), so the next call connects it first -- under that call's deadline, if any
    (:mod:`.scripts`). ``capped``: it was connected so, and its socket kept that
    deadline's short timeout; the next call without a deadline reconnects it."""

    __slots__ = ("busy", "capped", "conn", "connected", "owner", "pid", "pool", "used")

    def __init__(self, owner: _Client, pool: ConnectionPool) -> None:
        self.conn: Connection = pool.get_connection()  # first: if it raises,
        self.owner, self.pool, self.pid = owner, pool, os.getpid()  # __del__ counts nothing
        self.busy = False
        self.connected = True  # the pool hands out connected connections
        self.capped = False
        self.used = time.monotonic()

    @property
    def call_view(self) -> ScriptConnection:
        """``conn``, as a script call uses it."""
        return self.conn

    def done(self) -> None:
        """The call using it has ended: free for the thread's next call."""
        self.used, self.busy = time.monotonic(), False

    def __del__(self) -> None:  # the thread ended, or the client went: back to the pool
        with contextlib.suppress(Exception):
            with self.owner.lock:
                self.owner.count -= 1
            if self.pid == os.getpid():
                if self.capped:
                    self.call_view.disconnect()  # its socket has a past deadline's timeout
                self.pool.release(self.conn)


_CLIENTS: dict[int, _Client | None] = {}
_CLIENTS_LOCK = threading.Lock()


def _client_state(client: Redis, pool: ConnectionPool) -> _Client | None:
    with _CLIENTS_LOCK:
        if id(client) in _CLIENTS:
            return _CLIENTS[id(client)]
        plain = (
            type(pool) is ConnectionPool
            and getattr(pool, "cache", None) is None
            and isinstance(getattr(pool, "max_connections", None), int)
        )
        state = _CLIENTS[id(client)] = _Client(pool.max_connections // 4) if plain else None
        weakref.finalize(client, _CLIENTS.pop, id(client), None)
        return state


def kept_connection(client: Redis, pool: ConnectionPool) -> Kept | None:
    """This thread's kept connection of ``client`` (made on first use), marked busy;
    None when the pool's own get/release must be used (see the module doc). The caller
    sets ``busy`` back to False when its call is done."""
    try:
        state = _CLIENTS[id(client)]
    except KeyError:
        state = _client_state(client, pool)
    if state is None:
        return None
    kept: Kept | None = getattr(state.local, "kept", None)
    if kept is None or kept.pid != os.getpid() or kept.pool is not pool:
        with state.lock:
            if kept is None and state.count >= state.limit:
                return None
            state.count += 1
        try:
            kept = Kept(state, pool)
        except BaseException:
            with state.lock:
                state.count -= 1
            raise
        state.local.kept = kept  # (a forked child's inherited one is dropped, unreleased)
    elif kept.busy:
        return None
    elif time.monotonic() - kept.used > IDLE_CHECK:
        conn = kept.call_view
        try:
            if conn.can_read():  # closed by the server, or a reply nobody read
                conn.disconnect()
                kept.connected = False
        except Exception:
            conn.disconnect()  # reconnected by the call
            kept.connected = False
    kept.busy = True
    return kept


def sees_resends(client: object) -> bool:
    """True when a :class:`~.scripts.LuaScript` call on ``client`` sends (and re-sends)
    the command itself, so it can count its sends: a plain client (not a cluster's,
    not one bound to a single connection: redis-py re-sends for them, unseen); sync
    or asyncio."""
    return (
        getattr(client, "connection_pool", None) is not None
        and getattr(client, "connection", None) is None
    )
