"""Script calls through ``redis.asyncio``: the core's :class:`~celery_redislock.core.
scripts.LuaScript` sent as its sync ``__call__`` sends it (EVALSHA, EVAL after a
NOSCRIPT, the reply's stamp checked), awaited. The only I/O of the async classes.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoScriptError, RedisError

from ..core.scripts import LuaScript, StaleReply

__all__ = ["call"]


async def call(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    """``script(client, keys, args)`` through a ``redis.asyncio`` client: the same call and the
    same stamp check, awaited, on one pooled connection held for the call (as the
    sync call does: redis.asyncio's ``execute_command`` costs about as much client
    CPU again). A call interrupted between sending and reading (a cancellation)
    closes its connection: its reply is never left for another call."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(client, "connection", None) is not None:
        return await _via_client(script, client, keys, args)  # cluster, single
    conn = await pool.get_connection()
    try:
        return await conn.retry.call_with_retry(
            lambda: _on(script, conn, keys, args), lambda _error: conn.disconnect()
        )
    except BaseException as exc:
        if not isinstance(exc, RedisError):
            await conn.disconnect(nowait=True)  # a reply may be left unread
        raise
    finally:
        await pool.release(conn)

async def _on(script: LuaScript, conn: Any, keys: list[Any], args: list[Any]) -> Any:
    for attempt in (1, 2):
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            reply = await conn.read_response()
        except NoScriptError:
            await conn.send_command("EVAL", script.text, len(keys), *keys, *args)
            reply = await conn.read_response()
        if script.code is None or script._stamped(reply, args):
            return reply if script.code is None else reply[1]
        await conn.disconnect()  # it held another command's reply: never use it again
        if attempt == 2:
            break
    raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")

async def _via_client(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    for _ in (1, 2):
        try:
            reply = await client.execute_command(
                "EVALSHA", script.sha, len(keys), *keys, *args
            )
        except NoScriptError:
            reply = await client.eval(script.text, len(keys), *keys, *args)
        if script.code is None or script._stamped(reply, args):
            return reply if script.code is None else reply[1]
    raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")
