"""Script calls through ``redis.asyncio``: the core's :class:`~celery_redislock.core.
scripts.LuaScript` sent as its sync ``__call__`` sends it (EVALSHA, EVAL after a
NOSCRIPT, the reply's stamp checked), awaited. The only I/O of the async classes.

On a plain client a call holds one pooled connection and writes the EVALSHA packed
here (:func:`pack_evalsha`: what redis-py's ``pack_command`` sends, without its
per-argument encoder calls) straight to the connection's stream: redis-py's
``send_packed_command`` wraps every write in ``asyncio.wait_for``, a task and two
more turns of the loop per command, though a small write on an idle connection never
waits (it only does when the transport's buffer is full: then the write is awaited
with the socket timeout, as redis-py does).

Each event loop also keeps one connection of a client's pool for its script calls
(:class:`_Spare`): taken from the pool by a call and kept when it ends, where
redis.asyncio's pool would take and give back its lock and record both moves for
its metrics, for every command. One connection per loop and pool at most (a call
that finds it in use takes another from the pool, and gives that one back); a
pool of fewer than ``SPARE_MIN_POOL`` connections keeps them all for its user.
Only a call that ended cleanly keeps its connection; one that failed or was
interrupted (its connection closed, see :func:`call`) gives it back to the pool,
which checks it before its next use. Closing the client (``aclose``) closes the
kept connection with the pool's others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core.scripts import (
    _DEADLINE,
    _LAST_LOOK,
    DeadlinePassed,
    LuaScript,
    StaleReply,
    key_encoder,
)

__all__ = ["SPARE_MIN_POOL", "call", "pack_evalsha"]

SPARE_MIN_POOL = 10
"""A pool allowing fewer connections than this gets no spare (see the module docs)."""

_HEADS: dict[str, bytes] = {}  # a script's sha -> "EVALSHA <sha>" as two bulk strings


def pack_evalsha(script: LuaScript, keys: list[Any], args: list[Any],
                 encode: Callable[[Any], bytes]) -> bytes:  # fmt: skip
    """``EVALSHA <sha> <numkeys> *keys *args`` in the Redis protocol, as redis-py packs
    it (``encode``: the client's encoder for a str or another type, see
    :func:`~celery_redislock.core.scripts.key_encoder`; bytes go as they are, an int as
    its digits)."""
    head = _HEADS.get(script.sha)
    if head is None:
        head = _HEADS[script.sha] = b"$7\r\nEVALSHA\r\n$40\r\n%b\r\n" % script.sha.encode()
    count = b"%d" % len(keys)
    parts = [b"*%d\r\n%b$%d\r\n%b\r\n" % (3 + len(keys) + len(args), head, len(count), count)]
    append = parts.append
    for value in (*keys, *args):
        if value.__class__ is not bytes:
            value = b"%d" % value if value.__class__ is int else encode(value)
        append(b"$%d\r\n%b\r\n" % (len(value), value))
    return b"".join(parts)


async def call(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    """``script(client, keys, args)`` through a ``redis.asyncio`` client: the same call
    and the same stamp check, awaited, on one connection held for the call (the loop's
    kept one when free, see the module docs; not redis.asyncio's ``execute_command``,
    which costs about as much client CPU again). A call interrupted between sending
    and reading (a cancellation) closes its connection: its reply is never left for
    another call. Under
    :func:`~celery_redislock.core.scripts.reply_deadline` the whole call (a reconnect
    included: redis.asyncio's connect has no timeout by default) ends by that
    deadline with ``DeadlinePassed``."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return await _call(script, client, keys, args, None)
    budget = max(_LAST_LOOK, deadline - time.monotonic()) + _LAST_LOOK
    try:
        return await asyncio.wait_for(_call(script, client, keys, args, deadline), budget)
    except asyncio.TimeoutError as exc:
        raise DeadlinePassed(f"{script.name}: Redis did not answer before the deadline") from exc


async def _call(script: LuaScript, client: Any, keys: list[Any], args: list[Any],
                deadline: float | None) -> Any:  # fmt: skip
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(client, "connection", None) is not None:
        return await _via_client(script, client, keys, args)  # cluster, single
    packed = pack_evalsha(script, keys, args, key_encoder(client))
    loop = asyncio.get_running_loop()
    conn = _take_spare(pool, loop)
    if conn is None:
        conn = await pool.get_connection()
    if _closed(conn):
        await conn.disconnect(nowait=True)  # the send connects it again

    async def failed(_error: BaseException) -> None:
        await conn.disconnect()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlinePassed(f"{script.name}: Redis did not answer before the deadline")

    clean = False
    try:
        reply = await conn.retry.call_with_retry(
            lambda: _on(script, conn, packed, keys, args, deadline), failed
        )
        clean = True
        return reply
    except BaseException as exc:
        if not isinstance(exc, RedisError):
            await conn.disconnect(nowait=True)  # a reply may be left unread
        raise
    finally:
        if clean:
            await _put_back(pool, conn, loop)
        else:  # the pool checks it before its next use (a second cancel may have
            await pool.release(conn)  # stopped the disconnect above)


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


def _take_spare(pool: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """The loop's spare connection of ``pool``, now in use; None when it has none free."""
    spare = _SPARES.get(id(pool))
    if spare is None or spare.loop() is not loop:
        return None
    conn, spare.conn = spare.conn(), _none
    return conn


def _closed(conn: Any) -> bool:
    """True when the server closed ``conn`` while it was idle (a restart, ``CLIENT
    KILL``, the server's idle ``timeout``) and the loop saw it: a call must not spend
    a retry on it (or fail, with retries off). The pool's own check before handing a
    connection out is off in redis-py 8 with ``maint_notifications`` on "auto", its
    default, and the kept connection does not pass through it."""
    reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return False  # not connected: its send connects it
    return bool(reader.at_eof() or reader.exception() is not None
                or writer.transport.is_closing())  # fmt: skip


async def _put_back(pool: Any, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Keep ``conn`` as the loop's spare of ``pool`` if it has none, else give it back."""
    spare = _SPARES.get(id(pool))
    if spare is None:
        if getattr(pool, "max_connections", 0) < SPARE_MIN_POOL:
            await pool.release(conn)
            return
        spare = _SPARES[id(pool)] = _Spare(loop)
        weakref.finalize(pool, _SPARES.pop, id(pool), None)
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


async def _on(script: LuaScript, conn: Any, packed: bytes, keys: list[Any], args: list[Any],
              deadline: float | None) -> Any:  # fmt: skip
    for attempt in (1, 2):
        try:
            await _send(conn, packed)
            reply = await _read(conn, deadline)
        except NoScriptError:
            await conn.send_command("EVAL", script.text, len(keys), *keys, *args)
            reply = await _read(conn, deadline)
        if script.code is None or script._stamped(reply, args):
            return reply if script.code is None else reply[1]
        await conn.disconnect()  # it held another command's reply: never use it again
        if attempt == 2:
            break
    raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")


async def _send(conn: Any, packed: bytes) -> None:
    """``conn.send_packed_command(packed)`` without its ``wait_for`` when the write
    cannot wait: a connected connection with no health check due (redis-py's own
    send otherwise), the same errors raised, the connection closed on any."""
    writer = getattr(conn, "_writer", None)
    if writer is None or conn.health_check_interval:
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


async def _read(conn: Any, deadline: float | None) -> Any:
    if deadline is None:
        return await conn.read_response()
    # As the sync read (scripts._read_reply): until the deadline (a call made at it
    # still gets a round trip's worth), never longer than the socket timeout.
    timeout = max(_LAST_LOOK, deadline - time.monotonic())
    socket_timeout = getattr(conn, "socket_timeout", None)
    if socket_timeout is not None:
        timeout = min(timeout, socket_timeout)
    reply = await conn.read_response(timeout=timeout)
    if reply is None:  # redis.asyncio answers a caller's read timeout with None
        await conn.disconnect()  # the reply may still come: never read it as another's
        raise RedisTimeoutError(f"no reply within {timeout:.3f} s")
    return reply


async def _via_client(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    for _ in (1, 2):
        try:
            reply = await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await client.eval(script.text, len(keys), *keys, *args)
        if script.code is None or script._stamped(reply, args):
            return reply if script.code is None else reply[1]
    raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")
