"""Script calls through ``redis.asyncio``'s public API: the async driver of the core's
operations (:mod:`celery_redislock.core.operations`), and the only I/O of the async
classes besides pub/sub.

A call is the sync :class:`~celery_redislock.core.scripts.LuaScript`'s, awaited:
``EVALSHA``, and ``EVAL`` with the script's text after a NOSCRIPT (the script did not
run, so the re-send cannot apply it twice); the reply's stamp checked
(:meth:`~celery_redislock.core.scripts.LuaScript.checked`), so another command's
reply is never taken for this call's.

**On a plain client** a call holds one pooled connection and sends on it with the
connection's public calls (``send_command``, ``read_response``, ``disconnect``)
under the connection's own ``Retry`` (``retry.call_with_retry``), as redis.asyncio's
``execute_command`` does, without its per-command bookkeeping (a quarter of an
uncontended lock's client time, ``benchmarks/bench_asyncio.py``). redis.asyncio
closes a connection whose send or read was interrupted (a cancellation), so no reply
is ever left for another command. Each loop keeps one connection of a pool between
its calls (:class:`_Kept`, taken and given back with the pool's public
``get_connection`` / ``release``), as the sync calls keep one per thread
(``core/kept.py``); a call that finds it in use takes another from the pool. A call
counts its sends (``Call.sends``), so a lock's release judges a re-sent release as
the sync one does. **On a cluster client** (and one bound to a single connection) a
call is ``client.evalsha``, routed by redis.asyncio.

A connection the server closed while it was idle (a restart, ``CLIENT KILL``, its
idle timeout) fails its first send; the call is sent once more on a new one, even
on a client without retries (``from_url``'s): every script answers a re-send as its
first execution.

A burst (1,000 tasks acquiring at once) must not empty the client's pool: a plain
pool raises ``MaxConnectionsError`` past its ``max_connections`` (100 by default).
So a loop sends at most half of a pool's connections' worth of script calls at once
(:class:`_Gate`); the rest wait their turn, and the user's own commands still find
connections.

Under :func:`~celery_redislock.core.scripts.reply_deadline` the whole call (a
reconnect and a wait for a pooled connection included: redis.asyncio's connect has
no timeout by default) ends a round trip's worth past that deadline with
:class:`~celery_redislock.core.scripts.DeadlinePassed`: an ``asyncio.timeout``
scope in the calling task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import sys
import time
import weakref
from types import TracebackType
from typing import Final, TypeVar

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.connection import (
    AbstractConnection,
    ConnectionPool,
    ConnectionPoolInterface,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, KeyT

from ..core.clients import AsyncRedisClient
from ..core.operations import Operation
from ..core.scripts import _DEADLINE, _LAST_LOOK, DeadlinePassed, LuaScript, ScriptReply, StaleReply
from ..core.scripts import reply_deadline as reply_deadline

__all__ = ["MAX_BATCH", "SPARE_MIN_POOL", "batched_call", "call", "run"]

T = TypeVar("T")

SPARE_MIN_POOL = 10
"""A pool allowing fewer connections than this keeps none for a loop (its user's)."""


async def run(client: AsyncRedisClient, operation: Operation[T], batched: bool = False) -> T:
    """Run ``operation`` on a ``redis.asyncio`` ``client``: the twin of the sync
    :func:`~celery_redislock.core.operations.run`, each call awaited, its reply (or
    its exception) given back to the operation. ``batched``: its calls go out with
    the other batched calls of the loop's turn (see :func:`batched_call`; only for
    calls that may be sent twice)."""
    send = batched_call if batched else call
    try:
        request = next(operation)
        while True:
            try:
                if request.deadline is None:
                    reply = await send(
                        request.script, client, request.keys, request.args, request.sends
                    )
                else:
                    with reply_deadline(request.deadline):
                        reply = await send(
                            request.script, client, request.keys, request.args, request.sends
                        )
            except Exception as exc:  # the operation decides (e.g. a waiter rides it out)
                request = operation.throw(exc)
            else:
                request = operation.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


_UNBOUNDED = contextlib.nullcontext()  # no reply deadline (reusable: it has no state)


async def call(
    script: LuaScript,
    client: AsyncRedisClient,
    keys: list[KeyT],
    args: list[EncodableT],
    sends: list[None] | None = None,
) -> ScriptReply:
    """``script(client, keys, args)`` through a ``redis.asyncio`` client (see the
    module docs): the script's payload. ``sends``: one item appended per send on a
    plain client (more than one: the call may have run before)."""
    if sys.version_info < (3, 11):  # for mypy's 3.10: this package refuses to import there
        raise RuntimeError("celery_redislock.asyncio needs Python 3.11+")
    deadline = _DEADLINE.get()
    scope = (
        _UNBOUNDED
        if deadline is None
        else asyncio.timeout(max(_LAST_LOOK, deadline - time.monotonic()) + _LAST_LOOK)
    )
    try:
        async with scope:
            if not isinstance(client, AsyncRedis) or client.connection is not None:
                return await _via_client(script, client, keys, args)
            pool = client.connection_pool
            # One coroutine from here to the connection's send and read: each level
            # of awaiting costs again at every suspension (a lock's cycle is two).
            gate = _gate(pool)
            if gate.free > 0 and not gate.waiting:
                gate.free -= 1
            else:
                await gate.turn()
            loop = asyncio.get_running_loop()
            kept = _KEPT.get(pool)
            conn = None if kept is None else kept.take(loop)
            clean = False
            try:
                if conn is None:
                    conn = await pool.get_connection()
                for attempt in (1, 2):
                    try:
                        reply = await _once(script, conn, keys, args, sends)
                    except (RedisConnectionError, RedisTimeoutError):
                        # Most often a connection the server closed while it was idle
                        # (see the module docs; redis.asyncio closed it): sent again
                        # under the connection's Retry, at least once.
                        reply = await conn.retry.call_with_retry(
                            lambda: _once(script, conn, keys, args, sends),
                            lambda _error: conn.disconnect(),
                        )
                    try:
                        reply = script.checked(reply, args)
                    except StaleReply:
                        # Another command's reply (never expected: redis.asyncio
                        # closes an interrupted connection): out of step; once more.
                        await conn.disconnect()
                        if attempt == 2:
                            raise
                        continue
                    clean = True
                    return reply
            finally:
                gate.pass_on()
                if conn is not None:
                    await _put_back(pool, conn, loop, kept, clean)
    except TimeoutError as exc:
        if scope is _UNBOUNDED or not scope.expired():
            raise
        raise DeadlinePassed(f"{script.name}: no answer before the deadline") from exc
    raise AssertionError("unreachable: every attempt returns or raises")


async def _once(
    script: LuaScript,
    conn: AbstractConnection,
    keys: list[KeyT],
    args: list[EncodableT],
    sends: list[None] | None,
) -> ScriptReply:
    # The stamped reply; redis-py annotates read_response as Any (the boundary).
    reply: ScriptReply
    if sends is not None:
        sends.append(None)
    # A health check only where the user configured one (else a coroutine per send).
    check = bool(conn.health_check_interval)
    async with _OwnTimeout(conn, script.name):
        try:
            await conn.send_command(
                "EVALSHA", script.sha, len(keys), *keys, *args, check_health=check
            )
            reply = await conn.read_response()
            return reply
        except NoScriptError:
            await conn.send_command(
                "EVAL", script.text, len(keys), *keys, *args, check_health=check
            )
            reply = await conn.read_response()
            return reply


class _OwnTimeout:
    """A connection's ``socket_timeout`` put on a call's send and read(s) together,
    by one ``asyncio.timeout``, instead of on each by redis.asyncio.

    Why: under a socket timeout (redis-py 8's default: 5 s) redis.asyncio sends each
    command as a task of its own (``asyncio.wait_for``: on Python 3.11 a Task, a
    timer and two more turns of the loop per send) and reads each reply under
    another timer: a fifth of an uncontended lock's cycle
    (``benchmarks/bench_asyncio.py``, #30). Inside, the connection's own timeout is
    cleared; the connection is this call's alone meanwhile (checked out of its pool
    or kept), and its timeout is back before anyone else can use it, whatever ends
    the call. On expiry the connection is closed and ``redis.TimeoutError`` raised,
    as redis.asyncio does after its own timeout.

    Kept because no public call of redis.asyncio sends without that ``wait_for``
    while the connection has a timeout (measured #30 item 3: without it
    ``AsyncRedisLock`` went from 1.03-1.05x of the floor to 1.15-1.18x, level with
    redis.asyncio's ``Lock`` at 1.14-1.24x). redis-py changes the timeout itself
    during a server's maintenance (``set_tmp_settings`` / ``reset_tmp_settings``, on
    a maintenance notification read mid-call): the call's own value goes back only
    if the timeout is still the one it cleared, so redis-py's change is never undone."""

    __slots__ = ("conn", "limit", "scope", "what")
    conn: AbstractConnection
    what: str
    limit: float | None
    scope: contextlib.AbstractAsyncContextManager[object] | None

    def __init__(self, conn: AbstractConnection, what: str) -> None:
        if sys.version_info < (3, 11):  # for mypy's 3.10: this package refuses to import there
            raise RuntimeError("celery_redislock.asyncio needs Python 3.11+")
        self.conn = conn
        self.what = what
        self.limit = conn.socket_timeout
        self.scope = asyncio.timeout(self.limit) if self.limit else None

    async def __aenter__(self) -> None:
        if self.scope is not None:
            await self.scope.__aenter__()
            self.conn.socket_timeout = None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.scope is None:
            return
        if self.conn.socket_timeout is None:  # else redis-py set one meanwhile: kept
            self.conn.socket_timeout = self.limit
        try:
            await self.scope.__aexit__(exc_type, exc, traceback)
        except TimeoutError as error:  # this scope's: another's passes on as ``exc``
            await self.conn.disconnect()  # mid-send or mid-read: out of step
            raise RedisTimeoutError(f"{self.what}: no reply within {self.limit} s") from error


async def _put_back(
    pool: ConnectionPool,
    conn: AbstractConnection,
    loop: asyncio.AbstractEventLoop,
    kept: _Kept | None,
    clean: bool,
) -> None:
    """After a call on ``conn``: the kept connection kept (unless the call failed or
    was interrupted: the pool checks it before its next use), another kept if the
    pool keeps none for a live loop, else given back."""
    if kept is not None and kept.holds(conn):
        if clean:
            kept.busy = False
            return
        if _KEPT.get(pool) is kept:
            del _KEPT[pool]
    elif clean and pool.max_connections >= SPARE_MIN_POOL:
        current = _KEPT.get(pool)
        owner = None if current is None else current.loop()
        if owner is None or owner.is_closed():
            # The pool outlived the loop that kept one (a client used by one
            # asyncio.run after another): that one goes back, this one is kept.
            old = None if current is None else current.conn()
            try:
                _KEPT[pool] = _Kept(conn, loop)
            except TypeError:  # a pool or connection that takes no weak reference
                pass
            else:
                if old is not None and old is not conn:
                    await pool.release(old)
                return
    await pool.release(conn)


async def _via_client(
    script: LuaScript, client: AsyncRedisClient, keys: list[KeyT], args: list[EncodableT]
) -> ScriptReply:
    for attempt in (1, 2):
        try:
            reply = await client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await client.eval(script.text, len(keys), *keys, *args)
        try:
            return script.checked(reply, args)
        except StaleReply:
            if attempt == 2:
                raise
    raise AssertionError("unreachable: every attempt returns or raises")


MAX_BATCH = 100
"""Most calls sent in one write by :func:`batched_call`."""


class _Alone(enum.Enum):
    ALONE = enum.auto()


_ALONE: Final = _Alone.ALONE  # a batched call's answer: send the call yourself, with call()


async def batched_call(
    script: LuaScript,
    client: AsyncRedisClient,
    keys: list[KeyT],
    args: list[EncodableT],
    sends: list[None] | None = None,
) -> ScriptReply:
    """:func:`call`, sent with the other batched calls of this loop's turn on a plain
    client: a burst (1,000 tasks acquiring at once, the releases of sections that end
    together) goes out in writes of up to :data:`MAX_BATCH` calls on one connection,
    their replies read in order, where each call alone would take a connection and
    wake Redis once. Only for calls that may be sent twice (an acquire attempt finds
    its own queue place or lease; a semaphore release answers a re-send as the
    first): a call alone in its turn, and one its batch could not answer (an error
    reply, NOSCRIPT, a failed connection, another command's reply), is sent by its
    caller with :func:`call`. A caller cancelled before its write is left out; after
    it, its reply is dropped, as a cancelled call's would be."""
    if not isinstance(client, AsyncRedis) or client.connection is not None:
        return await call(script, client, keys, args, sends)
    pool = client.connection_pool
    loop = asyncio.get_running_loop()
    per_loop = _batches.get(loop)
    if per_loop is None:
        per_loop = _batches[loop] = weakref.WeakKeyDictionary()
    batch = per_loop.get(pool)
    if batch is None:
        batch = per_loop[pool] = _Batch()
    if not batch.items:
        loop.call_soon(batch.flush, pool)
    future: asyncio.Future[ScriptReply | _Alone] = loop.create_future()
    batch.items.append((script, keys, args, future))
    deadline = _DEADLINE.get()
    if deadline is None:
        reply = await future
    else:
        reply = await _by_deadline(future, deadline, script)
    if reply is _ALONE:
        return await call(script, client, keys, args, sends)
    if sends is not None:
        sends.append(None)
    return reply


async def _by_deadline(
    future: asyncio.Future[ScriptReply | _Alone], deadline: float, script: LuaScript
) -> ScriptReply | _Alone:
    if sys.version_info < (3, 11):  # for mypy's 3.10: this package refuses to import there
        raise RuntimeError("celery_redislock.asyncio needs Python 3.11+")
    try:
        async with asyncio.timeout(max(_LAST_LOOK, deadline - time.monotonic()) + _LAST_LOOK):
            return await future
    except TimeoutError as exc:
        raise DeadlinePassed(f"{script.name}: no answer before the deadline") from exc


_Item = tuple[LuaScript, list[KeyT], list[EncodableT], "asyncio.Future[ScriptReply | _Alone]"]


class _Batch:
    """The batched calls of one loop and pool waiting for this turn's write."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[_Item] = []

    def flush(self, pool: ConnectionPool) -> None:
        items = [item for item in self.items if not item[3].done()]  # cancelled meanwhile
        self.items = []
        if len(items) == 1:
            items[0][3].set_result(_ALONE)  # alone in its turn: its caller sends it
            return
        for start in range(0, len(items), MAX_BATCH):
            task = asyncio.get_running_loop().create_task(
                _send_batch(pool, items[start : start + MAX_BATCH])
            )
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)


_tasks: set[asyncio.Task[None]] = set()  # batches in flight (kept referenced)
_batches: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[ConnectionPool, _Batch]
] = weakref.WeakKeyDictionary()


async def _send_batch(pool: ConnectionPool, items: list[_Item]) -> None:
    """Write ``items`` at once on one connection and hand each its reply; any left
    unanswered is sent by its caller (see :func:`batched_call`)."""
    loop = asyncio.get_running_loop()
    gate = _gate(pool)
    if gate.free > 0 and not gate.waiting:
        gate.free -= 1
    else:
        await gate.turn()
    kept = _KEPT.get(pool)
    conn = None if kept is None else kept.take(loop)
    clean = False
    try:
        if conn is None:
            # ConnectionPool.get_connection is unannotated; its interface's is typed.
            checkout: ConnectionPoolInterface = pool
            conn = await checkout.get_connection()
        commands = [
            ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args, _ in items
        ]
        async with _OwnTimeout(conn, "batched script calls"):
            await conn.send_packed_command(
                conn.pack_commands(commands), check_health=bool(conn.health_check_interval)
            )
            for script, _keys, args, future in items:
                reply: ScriptReply | _Alone
                try:
                    reply = await conn.read_response()
                except ResponseError:  # an error reply to this call alone (NOSCRIPT too)
                    reply = _ALONE
                if reply is not _ALONE:
                    try:
                        reply = script.checked(reply, args)
                    except StaleReply:
                        await conn.disconnect()  # out of step: the rest sent alone
                        break
                if not future.done():
                    future.set_result(reply)
            else:
                clean = True
    except Exception:
        if conn is not None:
            await conn.disconnect()  # replies may be left unread
    finally:
        for *_call, future in items:
            if not future.done():
                future.set_result(_ALONE)
        gate.pass_on()
        if conn is not None:
            await _put_back(pool, conn, loop, kept, clean)


class _Kept:
    """The connection one loop keeps of a pool between its script calls (see the
    module docs). Held weakly, as its loop: the pool holds the connection (as one in
    use), and a connection may hold its pool, which must die when its user drops it."""

    __slots__ = ("busy", "conn", "loop")

    def __init__(self, conn: AbstractConnection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = weakref.ref(conn)
        self.loop = weakref.ref(loop)
        self.busy = False

    def take(self, loop: asyncio.AbstractEventLoop) -> AbstractConnection | None:
        """The connection, now busy, when it is this loop's and free; else None."""
        if self.busy or self.loop() is not loop:
            return None
        conn = self.conn()
        if conn is not None:
            self.busy = True
        return conn

    def holds(self, conn: AbstractConnection) -> bool:
        """True when ``conn`` is the kept connection."""
        return self.conn() is conn


_KEPT: weakref.WeakKeyDictionary[ConnectionPool, _Kept] = (
    weakref.WeakKeyDictionary()
)  # pool -> kept


class _Gate:
    """At most ``room`` script calls of one loop in flight through one pool; the
    others wait in turn. Not an ``asyncio.Semaphore``, which keeps its loop alive once
    contended (the registry is weak on the loop): here only a waiting task's future
    refers to it."""

    __slots__ = ("free", "waiting")

    def __init__(self, room: int) -> None:
        self.free = room
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def turn(self) -> None:
        """Wait for room (the caller found none free): it is handed over by
        :meth:`pass_on`."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.pass_on()  # handed over as it was cancelled: give it on
            else:
                self.waiting.remove(future)
            raise

    def pass_on(self) -> None:
        """A call ended: its room goes to the first waiting one, else back."""
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.free += 1


_Gates = weakref.WeakKeyDictionary[ConnectionPool, _Gate]  # pool -> its gate
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gates] = weakref.WeakKeyDictionary()


def _gate(pool: ConnectionPool) -> _Gate:
    """The running loop's bound on script calls in flight through ``pool``."""
    loop = asyncio.get_running_loop()
    per_loop = _gates.get(loop)
    if per_loop is None:
        per_loop = _gates[loop] = weakref.WeakKeyDictionary()
    gate = per_loop.get(pool)
    if gate is None:
        gate = per_loop[pool] = _Gate(max(1, (pool.max_connections or 100) // 2))
    return gate
