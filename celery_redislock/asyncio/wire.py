"""The async calls' connection-level I/O (used by :mod:`.calls`): the loop's kept
connection of a pool, the EVALSHA packed here, and writes and reads on a
``redis.asyncio`` connection without the machinery redis-py puts around each
command. Every shortcut falls back to redis-py's own method where its condition
does not hold (a connection not connected, a health check configured), and is
taken only on redis-py's own connection classes (:func:`plain`): a subclass that
overrides the read or the send (Sentinel's, which turns a demoted master's
``READONLY`` into a reconnect) keeps its own.

**Packing**: the EVALSHA is packed by :func:`celery_redislock.core.resp.pack_evalsha`,
the sync calls' packer.

**Writing** (:func:`send`): the packed command goes straight to the connection's
stream. redis-py's ``send_packed_command`` wraps every write in
``asyncio.wait_for`` -- a task and two more turns of the loop per command -- though a
small write on an idle connection never waits; it only does when the transport's
buffer is full, and then it is awaited with the socket timeout, as redis-py does.

**Reading** (:func:`read`): the reply from redis-py's own parser (pushes, errors and
every type as it reads them; a script's reply whole in the buffer, as
:mod:`.replies` reads it), under the socket timeout kept by one timer per
connection that aborts it (:class:`_Watch`), where redis-py's ``read_response``
enters an ``asyncio.timeout`` per read (a task-cancelling context and a timer
pushed onto and popped off the loop's heap, for every command).
A read that times out raises redis' ``TimeoutError`` and one that fails its
``ConnectionError``, the connection closed, as redis-py's read does.

**The kept connection** (:func:`take`, :func:`put_back`): each event loop keeps one
connection of a client's pool for its script calls: taken from the pool by a call
and kept when it ends, where redis.asyncio's pool would take and give back its lock
and record both moves for its metrics, for every command. One connection per loop
and pool at most (a call that finds it in use takes another from the pool, and
gives that one back); a pool of fewer than ``SPARE_MIN_POOL`` connections keeps
them all for its user. Only a call that ended cleanly keeps its connection; one
that failed or was interrupted (its connection closed, see :func:`.calls.call`)
gives it back to the pool. Closing the client (``aclose``) closes the kept
connection with the pool's others.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import replies

__all__ = ["SPARE_MIN_POOL", "closed", "plain", "put_back", "read", "send", "take"]

SPARE_MIN_POOL = 10
"""A pool allowing fewer connections than this gets no kept connection (see the
module docs)."""


class _Spare:
    """The connection a loop keeps of a pool between its script calls (None while a
    call uses it) and that loop. Both weakly: the pool holds the connection (as one in
    use), and a connection may hold its pool, which must die when its user drops it."""

    __slots__ = ("conn", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.conn: Callable[[], Any] = _none
        self.loop = weakref.ref(loop)


def _none() -> None:
    return None


_SPARES: dict[int, _Spare] = {}  # id(pool) -> its spare (dropped with the pool)


def take(pool: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """The loop's spare connection of ``pool``, now in use; None when it has none free."""
    spare = _SPARES.get(id(pool))
    if spare is None or spare.loop() is not loop:
        return None
    conn, spare.conn = spare.conn(), _none
    return conn


def closed(conn: Any) -> bool:
    """True when the server closed ``conn`` while it was idle (a restart, ``CLIENT
    KILL``, the server's idle ``timeout``) and the loop saw it: a call must not spend
    a retry on it (or fail, with retries off). The pool's own check before handing a
    connection out is off in redis-py 8 with ``maint_notifications`` on "auto", its
    default, and the kept connection does not pass through it."""
    reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return False  # not connected: its send connects it
    return bool(reader.at_eof() or reader.exception() is not None or writer.transport.is_closing())


async def put_back(pool: Any, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Keep ``conn`` as the loop's spare of ``pool`` if it has none, else give it back."""
    spare = _SPARES.get(id(pool))
    if spare is None:
        try:
            if getattr(pool, "max_connections", 0) < SPARE_MIN_POOL:
                raise TypeError("a small pool keeps its connections")
            weakref.ref(conn)
            weakref.finalize(pool, _SPARES.pop, id(pool), None)
        except TypeError:  # small, or a pool or connection that takes no weak reference
            await pool.release(conn)
            return
        spare = _SPARES[id(pool)] = _Spare(loop)
    owner = spare.loop()
    if owner is not loop:
        if owner is not None and not owner.is_closed():
            await pool.release(conn)  # another loop's pool (a client used by two threads)
            return
        # The pool outlived the loop that kept the spare: that connection goes back
        # (the pool's idle ones of that loop are in the same state) and ours stays.
        old, spare.conn, spare.loop = spare.conn(), _none, weakref.ref(loop)
        if old is not None:
            with contextlib.suppress(Exception):
                await pool.release(old)
    if spare.conn() is None:
        spare.conn = weakref.ref(conn)
    else:
        await pool.release(conn)


_PLAIN: dict[type, bool] = {}  # connection class -> plain(class)


def plain(cls: type) -> bool:
    """True when connections of class ``cls`` read and send as redis-py's own
    (``AbstractConnection``'s methods, not overridden): the shortcuts apply."""
    known = _PLAIN.get(cls)
    if known is None:
        known = _PLAIN[cls] = all(
            getattr(cls, method, None) is getattr(AbstractConnection, method)
            for method in ("read_response", "send_packed_command")
        )
    return known


async def read(conn: Any, timeout: float | None = None) -> Any:
    """``conn.read_response()`` (see the module docs): the next reply, an error reply
    raised, under the connection's socket timeout, or ``timeout`` seconds when given
    (then the connection is closed when it passes and redis' ``TimeoutError`` raised,
    as for the socket timeout)."""
    parser, writer = getattr(conn, "_parser", None), getattr(conn, "_writer", None)
    if parser is None or writer is None or conn.health_check_interval or not plain(conn.__class__):
        if timeout is None:
            return await conn.read_response()
        reply = await conn.read_response(timeout=timeout)
        if reply is None:  # redis.asyncio answers a caller's read timeout with None
            await conn.disconnect()  # the reply may still come: never read it as another's
            raise RedisTimeoutError(f"no reply within {timeout:.3f} s")
        return reply
    if timeout is None:
        timeout = conn.socket_timeout
    loop = asyncio.get_running_loop()
    watch = None
    if timeout is not None:
        watch = _watch(conn)
        watch.start(loop, loop.time() + timeout, writer.transport.abort)
    try:
        # A script's reply whole in the buffer (a burst's) is taken off it directly.
        reader, got = conn._reader, None
        if replies.usable(parser, reader):
            got = await replies.read_buffered(parser, reader)
        reply = await parser.read_response() if got is None else got[0]
    except BaseException as exc:
        await conn.disconnect(nowait=True)  # as redis-py's read: never read it again
        if watch is not None and loop.time() >= watch.expires and isinstance(exc, Exception):
            raise RedisTimeoutError(f"Timeout reading from {_where(conn)}") from None
        if isinstance(exc, OSError):
            raise RedisConnectionError(f"Error while reading from {_where(conn)}: {exc!r}") from exc
        raise
    finally:
        if watch is not None:
            watch.abort = None
    if isinstance(reply, ResponseError):
        raise reply from None
    return reply


class _Watch:
    """One connection's read timeout: a read sets when it expires and how to abort it;
    one timer serves many reads. When it fires it aborts the read in progress if that
    one expired, waits on for a later one, and ends when none is in progress; so a
    busy connection schedules about one timer per socket timeout, not one per read
    (a timer costs the loop's heap a push, a cancel and a clean-up)."""

    __slots__ = ("abort", "expires", "loop", "timer")

    def __init__(self) -> None:
        self.abort: Callable[[], None] | None = None  # set while a read is in progress
        self.expires = 0.0
        # The pending timer, weakly: the loop's heap holds it (and a closed loop drops
        # it); the watch, kept as long as its connection, never keeps a loop alive.
        self.timer: Callable[[], asyncio.TimerHandle | None] = _none
        self.loop: Callable[[], asyncio.AbstractEventLoop | None] = _none  # the timer's

    def start(
        self, loop: asyncio.AbstractEventLoop, expires: float, abort: Callable[[], None]
    ) -> None:
        """A read begins: abort it at ``expires`` (loop time) unless it ended."""
        self.expires, self.abort = expires, abort
        timer = self.timer()
        if timer is not None:
            if timer.when() <= expires and self.loop() is loop:
                return  # the pending timer comes first and looks again
            timer.cancel()
        self.timer = weakref.ref(loop.call_at(expires, self._fire))
        self.loop = weakref.ref(loop)

    def _fire(self) -> None:
        self.timer = _none
        abort = self.abort
        if abort is None:
            return  # no read in progress: the next one schedules again
        loop = asyncio.get_running_loop()
        if loop.time() >= self.expires:
            self.abort = None
            abort()  # the read then fails (read() raises the timeout)
        else:
            self.timer = weakref.ref(loop.call_at(self.expires, self._fire))


_WATCHES: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()


def _watch(conn: Any) -> _Watch:
    watch = _WATCHES.get(conn)
    if watch is None:
        watch = _WATCHES[conn] = _Watch()
    return watch


def _where(conn: Any) -> str:
    host_error = getattr(conn, "_host_error", None)
    return str(host_error()) if host_error is not None else repr(conn)


async def send(conn: Any, packed: bytes) -> None:
    """``conn.send_packed_command(packed)`` without its ``wait_for`` when the write
    cannot wait: a connected connection with no health check due (redis-py's own
    send otherwise), the same errors raised, the connection closed on any."""
    writer = getattr(conn, "_writer", None)
    if writer is None or conn.health_check_interval or not plain(conn.__class__):
        await conn.send_packed_command(packed)
        return
    try:
        writer.write(packed)
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            # Not all written (or the connection is going): as redis-py's send.
            await asyncio.wait_for(writer.drain(), conn.socket_timeout)
    except asyncio.TimeoutError:
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket: {exc!r}") from exc
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
