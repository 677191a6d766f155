"""Script calls of one loop sent together: the calls a loop's tasks make in the same
turn of the loop (a burst of acquires: 1,000 tasks started at once; waiters' polls,
which fall on a grid, see :mod:`.notifier`; the releases of sections that end
together) go out as one write on one connection,
their replies read in order, where each call alone would take a connection from the
pool, write and wake Redis once.

Each call keeps the meaning of :func:`.calls.call`: the same script, the same stamp
check. A write whose connection fails or times out is sent again once, its
unanswered calls together, on a new connection. A call alone in its turn, and every
call left unanswered by an error (a connection error or timeout twice, a stale
reply, NOSCRIPT twice), is sent again by its own caller
through :func:`.calls.call` (which retries, loads the script, and keeps the caller's
deadline and cancellation). Only for calls that may be sent twice (an acquire
attempt: a re-sent one finds its own queue place or lease; a semaphore release: a
re-sent one answers as the first did). A caller cancelled (or
past its deadline) before the write is left out; after it, its reply is dropped, as a
cancelled call's would be (its acquire's clean-up runs, see :mod:`.primitive`). The
write's replies are awaited until the latest deadline of its callers.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core.resp import key_encoder, pack_evalsha
from ..core.scripts import _DEADLINE, LuaScript
from . import wire
from .calls import by_deadline, call, read_timeout

__all__ = ["MAX_BATCH", "MAX_IN_FLIGHT", "OnReply", "batched_call"]

log = logging.getLogger(__name__)

MAX_BATCH = 100
"""Most calls sent in one write."""

MAX_IN_FLIGHT = 2
"""Most writes of one script, client and loop awaiting their replies; the rest of a
burst waits its turn, so another script's calls (a release) are not queued in Redis
behind the whole burst (1,000 acquires: 10 writes, some 25 ms of Redis time)."""

_ALONE = object()  # a future's result: send the call yourself (see the module docs)

# packed, args, the caller's future, its deadline, what to do with the reply at once
_Item = tuple[bytes, list[Any], "asyncio.Future[Any]", float | None, "OnReply | None"]
OnReply = Callable[[Any], None]

_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str], _Batch]] = (
    weakref.WeakKeyDictionary()
)


class _Batch:
    """The calls of one script, client and loop waiting for this turn's write (or,
    past :data:`MAX_IN_FLIGHT`, for a write to be answered)."""

    __slots__ = ("client", "flying", "items", "script")

    def __init__(self, script: LuaScript, client: Any) -> None:
        self.script = script
        self.client = weakref.ref(client)
        self.items: list[_Item] = []
        self.flying = 0  # writes sent and not all answered

    def flush(self) -> None:
        items = [item for item in self.items if not item[2].done()]  # cancelled meanwhile
        client = self.client()
        room = max(0, MAX_IN_FLIGHT - self.flying) * MAX_BATCH
        self.items = items[room:] if client is not None else []
        loop = asyncio.get_running_loop()
        for start in range(
            0, min(len(items), room) if client is not None else len(items), MAX_BATCH
        ):
            part = items[start : start + MAX_BATCH]
            if client is None or len(part) == 1:
                _alone(part)
            else:
                self.flying += 1
                _spawn(loop, _send(self.script, client, part)).add_done_callback(self._answered)

    def _answered(self, _task: asyncio.Task[None]) -> None:
        self.flying -= 1
        if self.items:  # calls left waiting for room: their turn
            self.flush()


_tasks: set[asyncio.Task[None]] = set()  # batches in flight (kept referenced)


def _spawn(loop: asyncio.AbstractEventLoop, coroutine: Any) -> asyncio.Task[None]:
    task = loop.create_task(coroutine)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


async def batched_call(
    script: LuaScript,
    client: Any,
    keys: list[Any],
    args: list[Any],
    on_reply: OnReply | None = None,
) -> Any:
    """``call(script, client, keys, args)``, sent with the other such calls of this
    loop's turn (see the module docs); a cluster or single-connection client calls
    alone. ``on_reply`` is called with the reply once, as soon as
    it is read: in a burst, before any caller of the burst resumes, and even when
    its caller was cancelled meanwhile (a release's hand-over to this loop's waiters:
    they go on without waiting for their releasers' turn). It must not raise."""
    pool = getattr(client, "connection_pool", None)
    alone = pool is None or getattr(client, "connection", None) is not None
    if alone:
        return _heard(on_reply, await call(script, client, keys, args))
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
    deadline = _DEADLINE.get()
    packed = pack_evalsha(script.head, keys, args, key_encoder(client))
    batch.items.append((packed, args, future, deadline, on_reply))
    reply = await (future if deadline is None else by_deadline(future, deadline, script.name))
    if reply is _ALONE:
        return _heard(on_reply, await call(script, client, keys, args))
    return reply


def _heard(on_reply: OnReply | None, reply: Any) -> Any:
    if on_reply is not None:
        on_reply(reply)
    return reply


async def _send(script: LuaScript, client: Any, items: list[_Item]) -> None:
    """Write ``items`` at once and hand each its reply; those left unanswered are
    sent again by their callers."""
    pool = client.connection_pool
    loop = asyncio.get_running_loop()
    # The loop's kept connection when free (as a call alone, see wire.take): the
    # pool's get_connection costs as much client time as a few replies' reading.
    conn = wire.take(pool, loop)
    try:
        if conn is None:
            conn = await pool.get_connection()
        elif wire.closed(conn):
            await conn.disconnect(nowait=True)  # the send connects it again
    except BaseException as exc:  # each caller's own call says what it is
        _alone(items)
        if conn is not None:
            await pool.release(conn)
        if isinstance(exc, Exception):
            return
        raise
    deadlines = [item[3] for item in items]
    last = None if None in deadlines else max(d for d in deadlines if d is not None)
    clean = False
    try:
        try:
            missing = await _round(script, conn, items, last)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # Reset or stalled mid-burst: the calls not answered (nor past their
            # deadlines) go out again together, once, on a new connection. Each sent
            # alone would take a connection of its own at once: a burst's hundreds
            # emptied the pool (MaxConnectionsError).
            await conn.disconnect(nowait=True)
            missing = await _round(script, conn, [it for it in items if not it[2].done()], last)
        if missing:  # NOSCRIPT (a restart, SCRIPT FLUSH): load it, send those again
            await conn.send_command("SCRIPT", "LOAD", script.text)
            await wire.read(conn, read_timeout(conn, last))
            _alone(await _round(script, conn, missing, last))
        clean = True
    except BaseException as exc:
        await conn.disconnect(nowait=True)  # out of step, gone, or replies left unread
        _alone(items)
        if not isinstance(exc, (RedisError, OSError, _Stale)):
            raise
    finally:
        if clean:
            await wire.put_back(pool, conn, loop)
        else:
            await pool.release(conn)


async def _round(
    script: LuaScript, conn: Any, items: list[_Item], deadline: float | None
) -> list[_Item]:
    """One write of ``items`` and their replies read; those answered NOSCRIPT."""
    if not items:
        return []
    await wire.send(conn, b"".join(item[0] for item in items))
    missing: list[_Item] = []
    for item in items:
        try:
            reply = await wire.read(conn, read_timeout(conn, deadline))
        except NoScriptError:
            missing.append(item)
            continue
        except ResponseError as exc:  # an error reply to this call alone
            _fail(item[2], exc)
            continue
        if script.code is not None:
            if not script._stamped(reply, item[1]):
                raise _Stale
            reply = reply[1]
        if item[4] is not None:
            try:
                item[4](reply)
            except Exception:  # a bug: its caller still gets the reply
                log.exception("celery_redislock: handling a %s reply failed", script.name)
        if not item[2].done():
            item[2].set_result(reply)
    return missing


def _alone(items: list[_Item]) -> None:
    """Tell each caller not answered yet to send its call itself."""
    for item in items:
        if not item[2].done():
            item[2].set_result(_ALONE)


class _Stale(Exception):
    """A reply of the batch was not its call's: the connection is out of step."""


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
