"""A TCP proxy on 127.0.0.1 that injects network faults between a client and Redis.

Point a client at the proxy (``proxy.client()``, a ``redis.Redis`` with redis-py's
default ``Retry``; or ``proxy.port`` / ``proxy.url``) instead of the server and the
proxy forwards bytes both ways, except when told otherwise:

* ``proxy.drop_reply(match=b"...", times=1)`` -- the next request (a chunk the client
  sends) containing ``match`` (any request when ``None``) is forwarded to Redis, which
  executes it; its reply is thrown away and the client's connection is closed. redis-py
  then sees a ``ConnectionError`` and, with its default ``Retry``, sends the same command
  again on a new connection: the server runs it twice. ``proxy.dropped`` counts the
  replies thrown away; ``proxy.wait_dropped(n)`` waits for that count.
* ``proxy.delay = 0.1`` -- every chunk is delivered that many seconds after it arrived,
  in each direction (a 0.1 s delay adds 0.2 s to a round trip). Chunks keep their order
  and a delayed connection still carries many requests in flight.
* ``proxy.pause()`` / ``proxy.resume()`` -- hold every byte in both directions (the
  connections stay open, as with a stalled network or a stopped peer) until resumed.
* ``proxy.hold(match=b"...")`` -- a request containing ``match`` (and whatever its
  connection sends after it) is held at the proxy until ``proxy.release_held()``,
  while other connections carry on: one command stalled on its way to Redis.
  ``proxy.held`` counts the requests held so far.
* ``proxy.cut()`` -- close every connection now (a network reset).

It is thread-based: one accepting thread and two threads per connection direction (a
reader and a delayed writer). Use it as a context manager or through the
``fault_proxy`` fixture in ``tests/conftest.py``; ``stop()`` closes everything.
Matching is on whole chunks as ``recv`` returned them: a redis-py command (one
``sendall``) arrives as one chunk on loopback, so match a token or a script SHA.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from types import TracebackType
from typing import Any

import redis

__all__ = ["FaultProxy"]

_CHUNK = 65536


class _Pipe:
    """One direction of one connection: reads ``src``, writes ``dst`` after the delay."""

    def __init__(
        self, conn: _Connection, src: socket.socket, dst: socket.socket, upstream: bool
    ) -> None:
        self.conn = conn
        self.src = src
        self.dst = dst
        self.upstream = upstream  # client -> server
        self.pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

    def start(self) -> None:
        for target in (self._read, self._write):
            threading.Thread(
                target=target, daemon=True, name=f"faultproxy-{target.__name__}"
            ).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(_CHUNK)
                if not data:
                    break
                self.pending.put((time.monotonic() + self.conn.proxy.delay, data))
        except OSError:
            pass
        self.pending.put(None)

    def _write(self) -> None:
        proxy = self.conn.proxy
        try:
            while True:
                item = self.pending.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                proxy._running.wait()
                if self.upstream and proxy._holds(data):
                    proxy._unheld.wait()
                if self.conn.closed:
                    break
                if self.upstream:
                    self.conn.armed = proxy._take_drop(data)
                elif self.conn.armed:
                    proxy._note_dropped()
                    break
                self.dst.sendall(data)
        except OSError:
            pass
        self.conn.close()


class _Connection:
    """A client connection and its upstream connection to Redis."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.armed = False  # the last request forwarded asked for its reply to be dropped
        self.closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        _Pipe(self, self.client, self.server, upstream=True).start()
        _Pipe(self, self.server, self.client, upstream=False).start()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.proxy._forget(self)


class FaultProxy:
    """A fault-injecting TCP proxy in front of ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int, *, db: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.db = db
        self.delay = 0.0  # seconds added to every chunk, each way
        self.dropped = 0  # replies thrown away so far
        self._running = threading.Event()
        self._running.set()
        self._hold: bytes | None = None
        self._unheld = threading.Event()
        self._unheld.set()
        self.held = 0
        self._guard = threading.Condition()
        self._drops: list[tuple[bytes | None, int]] = []
        self._connections: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port of 127.0.0.1 and start accepting."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection (resumes a pause first)."""
        self._running.set()
        self._unheld.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        self.cut()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """A ``redis://`` URL through the proxy (note: ``Redis.from_url`` does not retry)."""
        return f"redis://127.0.0.1:{self.port}/{self.db}"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` through the proxy with redis-py's defaults (``Retry`` x10).

        ``Redis.from_url`` makes connections with no retries in redis-py 8.1, unlike
        ``Redis(host=..., port=...)``; this uses the latter so a dropped reply is re-sent.
        """
        return redis.Redis(host="127.0.0.1", port=self.port, db=self.db, **kwargs)

    # -- faults -----------------------------------------------------------------------

    def drop_reply(self, match: bytes | None = None, times: int = 1) -> None:
        """Drop the reply of the next ``times`` requests containing ``match`` (see module doc)."""
        with self._guard:
            self._drops.append((match, times))

    def wait_dropped(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until ``count`` replies in all have been dropped; False on timeout."""
        with self._guard:
            return self._guard.wait_for(lambda: self.dropped >= count, timeout)

    def pause(self) -> None:
        """Hold every byte in both directions until :meth:`resume`."""
        self._running.clear()

    def resume(self) -> None:
        """Deliver what was held and forward normally again."""
        self._running.set()

    def hold(self, match: bytes) -> None:
        """Hold requests containing ``match`` (see the module doc)."""
        with self._guard:
            self._hold = match
            self._unheld.clear()

    def release_held(self) -> None:
        """Deliver the held requests and hold nothing more."""
        with self._guard:
            self._hold = None
        self._unheld.set()

    def wait_held(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until ``count`` requests in all have been held; False on timeout."""
        with self._guard:
            return self._guard.wait_for(lambda: self.held >= count, timeout)

    def _holds(self, data: bytes) -> bool:
        with self._guard:
            if self._hold is None or self._hold not in data:
                return False
            self.held += 1
            self._guard.notify_all()
            return True

    def cut(self) -> None:
        """Close every open connection now."""
        with self._guard:
            connections = list(self._connections)
        for conn in connections:
            conn.close()

    @property
    def connections(self) -> int:
        """Client connections open through the proxy."""
        with self._guard:
            return len(self._connections)

    # -- internals ----------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, server)
            with self._guard:
                self._connections.add(conn)
            conn.start()

    def _take_drop(self, request: bytes) -> bool:
        with self._guard:
            for i, (match, times) in enumerate(self._drops):
                if match is None or match in request:
                    if times <= 1:
                        del self._drops[i]
                    else:
                        self._drops[i] = (match, times - 1)
                    return True
        return False

    def _note_dropped(self) -> None:
        with self._guard:
            self.dropped += 1
            self._guard.notify_all()

    def _forget(self, conn: _Connection) -> None:
        with self._guard:
            self._connections.discard(conn)
