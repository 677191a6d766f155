"""Script calls through ``redis.asyncio``: the core's :class:`~celery_redislock.core.
scripts.LuaScript` sent as its sync ``__call__`` sends it (EVALSHA, EVAL after a
NOSCRIPT, the reply's stamp checked), awaited. The only I/O of the async classes.

On a plain client a call holds one connection -- the loop's kept one when free --
and writes and reads it through :mod:`.wire`, lighter than redis.asyncio's
``execute_command`` (about as much client CPU again per command); a cluster client's
calls go through ``execute_command``, which routes them by their keys.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from ..core.operations import Operation
from ..core.resp import key_encoder, pack_evalsha
from ..core.scripts import (
    _DEADLINE,
    _LAST_LOOK,
    DeadlinePassed,
    LuaScript,
    StaleReply,
    reply_deadline,
)
from . import wire

__all__ = ["call", "run"]

T = TypeVar("T")


async def run(client: Any, operation: Operation[T]) -> T:
    """Run ``operation`` (see :mod:`celery_redislock.core.operations`) on an async
    ``client``: the twin of the sync :func:`~celery_redislock.core.operations.run`,
    each call awaited, its reply (or its exception) given back to the operation."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = operation.send(reply) if error is None else operation.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        error = None
        try:
            if request.deadline is None:
                reply = await call(
                    request.script, client, request.keys, request.args, request.sends
                )
            else:
                with reply_deadline(request.deadline):
                    reply = await call(
                        request.script, client, request.keys, request.args, request.sends
                    )
        except Exception as exc:  # the operation decides (e.g. a waiter rides it out)
            reply, error = None, exc


async def call(
    script: LuaScript,
    client: Any,
    keys: list[Any],
    args: list[Any],
    sends: list[None] | None = None,
) -> Any:
    """``script(client, keys, args)`` through a ``redis.asyncio`` client: the same call
    and the same stamp check, awaited, on one connection held for the call (see the
    module docs). A call interrupted between sending and reading (a cancellation)
    closes its connection: its reply is never left for another call. Under
    :func:`~celery_redislock.core.scripts.reply_deadline` the whole call (a reconnect
    included: redis.asyncio's connect has no timeout by default) ends by that
    deadline with ``DeadlinePassed``. ``sends``: as for the sync call (see
    :func:`~celery_redislock.core.scripts.sees_resends`), one item appended per send
    on a plain client; more than one: the call may have run before."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return await _call(script, client, keys, args, None, sends)
    return await by_deadline(
        _call(script, client, keys, args, deadline, sends), deadline, script.name
    )


async def by_deadline(awaitable: Awaitable[Any], deadline: float, name: str) -> Any:
    """``await awaitable``, ended with ``DeadlinePassed`` when it has not finished a
    round trip's worth past ``deadline``."""
    budget = max(_LAST_LOOK, deadline - time.monotonic()) + _LAST_LOOK
    if sys.version_info >= (3, 11):  # a scope in this task (wait_for makes a task per call)
        try:
            async with asyncio.timeout(budget) as scope:
                return await awaitable
        except TimeoutError as exc:
            if not scope.expired():
                raise
            raise DeadlinePassed(f"{name}: no answer before the deadline") from exc
    try:
        return await asyncio.wait_for(awaitable, budget)
    except asyncio.TimeoutError as exc:
        raise DeadlinePassed(f"{name}: Redis did not answer before the deadline") from exc


async def _call(
    script: LuaScript,
    client: Any,
    keys: list[Any],
    args: list[Any],
    deadline: float | None,
    sends: list[None] | None,
) -> Any:
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(client, "connection", None) is not None:
        return await _via_client(script, client, keys, args)  # cluster, single
    packed = pack_evalsha(script.head, keys, args, key_encoder(client))
    loop = asyncio.get_running_loop()
    conn = wire.take(pool, loop)
    if conn is None:
        conn = await pool.get_connection()
    if wire.closed(conn):
        await conn.disconnect(nowait=True)  # the send connects it again

    async def failed(_error: BaseException) -> None:
        await conn.disconnect()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlinePassed(f"{script.name}: Redis did not answer before the deadline")

    clean = False
    try:
        reply = await conn.retry.call_with_retry(
            lambda: _on(script, conn, packed, keys, args, deadline, sends), failed
        )
        clean = True
        return reply
    except BaseException as exc:
        if not isinstance(exc, RedisError):
            await conn.disconnect(nowait=True)  # a reply may be left unread
        raise
    finally:
        if clean:
            await wire.put_back(pool, conn, loop)
        else:  # the pool checks it before its next use (a second cancel may have
            await pool.release(conn)  # stopped the disconnect above)


async def _on(
    script: LuaScript,
    conn: Any,
    packed: bytes,
    keys: list[Any],
    args: list[Any],
    deadline: float | None,
    sends: list[None] | None,
) -> Any:
    for attempt in (1, 2):
        if sends is not None:
            sends.append(None)
        try:
            await wire.send(conn, packed)
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


async def _read(conn: Any, deadline: float | None) -> Any:
    return await wire.read(conn, read_timeout(conn, deadline))


def read_timeout(conn: Any, deadline: float | None) -> float | None:
    """How long a read may wait, as the sync read (scripts._read_reply): until
    ``deadline`` (a call made at it still gets a round trip's worth), never longer than
    the socket timeout; None (the connection's own socket timeout) without one."""
    if deadline is None:
        return None
    timeout = max(_LAST_LOOK, deadline - time.monotonic())
    socket_timeout = getattr(conn, "socket_timeout", None)
    return timeout if socket_timeout is None else min(timeout, socket_timeout)


async def _via_client(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    for _ in (1, 2):
        try:
            reply = await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await client.eval(script.text, len(keys), *keys, *args)
        if script.code is None or script._stamped(reply, args):
            return reply if script.code is None else reply[1]
    raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")
