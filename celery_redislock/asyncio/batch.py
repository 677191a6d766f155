"""Script calls of one loop sent together: the calls a loop's tasks make in the same
turn of the loop (a burst of acquires: 1,000 tasks started at once) go out as one
write on one connection, their replies read in order, where each call alone would
take a connection from the pool, write and wake Redis once.

Each call keeps the meaning of :func:`.calls.call`: the same script, the same stamp
check; a NOSCRIPT reply, a connection error or a stale reply sends the calls not yet
answered again one by one through :func:`.calls.call` (which retries, and loads the
script). Only for calls that may be sent twice (an acquire attempt: a re-sent one
finds its own queue place or lease). A caller cancelled (or past its deadline)
before the write is left out; after it, its reply is dropped, as a cancelled call's
would be (its acquire's clean-up runs, see :mod:`.primitive`).
"""

from __future__ import annotations

import asyncio
import sys
import time
import weakref
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..core.scripts import _DEADLINE, _LAST_LOOK, DeadlinePassed, LuaScript, key_encoder
from . import wire
from .calls import call

__all__ = ["MAX_BATCH", "batched_call"]

MAX_BATCH = 100
"""Most calls sent in one write."""

_ALONE_AT_ONCE = 8  # calls sent alone (after an error) at the same time

_Item = tuple[bytes, list[Any], list[Any], "asyncio.Future[Any]"]  # packed, keys, args

_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str], _Batch]] = (
    weakref.WeakKeyDictionary()
)


class _Batch:
    """The calls of one script, client and loop waiting for this turn's write."""

    __slots__ = ("client", "items", "script")

    def __init__(self, script: LuaScript, client: Any) -> None:
        self.script = script
        self.client = weakref.ref(client)
        self.items: list[_Item] = []

    def flush(self) -> None:
        items, self.items = self.items, []
        items = [item for item in items if not item[3].done()]  # cancelled meanwhile
        client = self.client()
        loop = asyncio.get_running_loop()
        for start in range(0, len(items), MAX_BATCH):
            part = items[start : start + MAX_BATCH]
            if client is None:
                for item in part:
                    _fail(item[3], RuntimeError("the client was closed"))
                continue
            _spawn(loop, _send(self.script, client, part))


_tasks: set[asyncio.Task[None]] = set()  # batches in flight (kept referenced)


def _spawn(loop: asyncio.AbstractEventLoop, coroutine: Any) -> None:
    task = loop.create_task(coroutine)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def batched_call(script: LuaScript, client: Any, keys: list[Any], args: list[Any]) -> Any:
    """``call(script, client, keys, args)``, sent with the other such calls of this
    loop's turn (see the module docs); a cluster or single-connection client, or
    Python 3.10, calls alone."""
    pool = getattr(client, "connection_pool", None)
    alone = pool is None or getattr(client, "connection", None) is not None
    if alone or sys.version_info < (3, 11):
        return await call(script, client, keys, args)
    loop = asyncio.get_running_loop()
    per_loop = _batches.get(loop)
    if per_loop is None:
        per_loop = _batches[loop] = {}
    batch = per_loop.get((id(client), script.sha))
    if batch is None or batch.client() is not client:
        batch = per_loop[(id(client), script.sha)] = _Batch(script, client)
    future: asyncio.Future[Any] = loop.create_future()
    if not batch.items:
        loop.call_soon(batch.flush)
    batch.items.append((wire.pack_evalsha(script, keys, args, key_encoder(client)), keys, args,
                        future))  # fmt: skip
    deadline = _DEADLINE.get()
    if deadline is None:
        return await future
    budget = max(_LAST_LOOK, deadline - time.monotonic()) + _LAST_LOOK
    try:
        async with asyncio.timeout(budget) as scope:
            return await future
    except TimeoutError as exc:
        if not scope.expired():
            raise
        raise DeadlinePassed(f"{script.name}: no answer before the deadline") from exc


async def _send(script: LuaScript, client: Any, items: list[_Item]) -> None:
    """Write ``items`` at once and hand each its reply; those left unanswered by an
    error are sent again alone."""
    if len(items) == 1:
        await _alone(script, client, items)
        return
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()
    except Exception:  # each call alone says what it is
        await _alone(script, client, items)
        return
    again: list[_Item] = []
    try:
        missing = await _round(script, conn, items)
        if missing:  # NOSCRIPT (a restart, SCRIPT FLUSH): load it, send those again
            await conn.send_command("SCRIPT", "LOAD", script.text)
            await wire.read(conn)
            again = await _round(script, conn, missing)
    except (RedisError, OSError, _Stale):
        await conn.disconnect(nowait=True)  # out of step, or gone: never read it again
        again = [item for item in items if not item[3].done()]
    except BaseException:
        await conn.disconnect(nowait=True)  # replies may be left unread
        for item in items:
            item[3].cancel()
        raise
    finally:
        await pool.release(conn)
    if again:
        await _alone(script, client, again)


async def _round(script: LuaScript, conn: Any, items: list[_Item]) -> list[_Item]:
    """One write of ``items`` and their replies read; those answered NOSCRIPT."""
    await wire.send(conn, b"".join(item[0] for item in items))
    missing: list[_Item] = []
    for item in items:
        try:
            reply = await wire.read(conn)
        except NoScriptError:
            missing.append(item)
            continue
        except ResponseError as exc:  # an error reply to this call alone
            _fail(item[3], exc)
            continue
        if script.code is not None:
            if not script._stamped(reply, item[2]):
                raise _Stale
            reply = reply[1]
        if not item[3].done():
            item[3].set_result(reply)
    return missing


async def _alone(script: LuaScript, client: Any, items: list[_Item]) -> None:
    """Send each call by itself, at once (see :func:`.calls.call`), its outcome to its
    future."""

    async def one(keys: list[Any], args: list[Any], future: asyncio.Future[Any]) -> None:
        try:
            reply = await call(script, client, keys, args)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:  # handed to its caller
            _fail(future, exc)
        else:
            if not future.done():
                future.set_result(reply)

    for start in range(0, len(items), _ALONE_AT_ONCE):  # not one connection each at once
        await asyncio.gather(*(one(keys, args, future)
                               for _, keys, args, future in items[start : start + _ALONE_AT_ONCE]
                               if not future.done()))  # fmt: skip


class _Stale(Exception):
    """A reply of the batch was not its call's: the connection is out of step."""


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
