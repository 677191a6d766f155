"""Lua scripts from ``core/lua/``: read once, run by EVALSHA, NOSCRIPT recovered.

Each script is read, expanded and hashed once at import, and reaches Redis as one
self-contained source (includes and constants: :mod:`.lua_text`).

A call sends ``EVALSHA``; when the server answers NOSCRIPT (a restart, a failover or
``SCRIPT FLUSH`` emptied its cache) the same call is re-sent as ``EVAL``, which runs
the script and caches it again. A NOSCRIPT reply means the script did not run, so
the retry cannot apply it twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import RedisLockError
from .kept import kept_connection, sees_resends
from .lua_text import expand, fill
from .resp import evalsha_head, key_encoder, pack_evalsha

__all__ = [
    "DeadlinePassed",
    "LuaScript",
    "StaleReply",
    "as_text",
    "discard_idle_connections",
    "current_deadline",
    "expand",
    "key_encoder",
    "reply_deadline",
    "sees_resends",
]

_STAMP = re.compile(r"^local STAMP = '(\w+)' \.\. string\.sub\(ARGV\[1\], 1, 8\)$", re.M)


class StaleReply(RedisLockError, RedisError):
    """A script's reply did not carry its call's stamp twice running: the connection
    gave another command's reply (see :meth:`LuaScript.checked`)."""


class DeadlinePassed(RedisLockError, RedisTimeoutError):
    """Redis did not answer a script call before the caller's deadline (see
    :func:`reply_deadline`); the call may or may not have run."""


_LAST_LOOK = 0.05  # seconds a call sent at or past its deadline may wait for its reply

_DEADLINE: ContextVar[float | None] = ContextVar("celery_redislock_deadline", default=None)


@contextlib.contextmanager
def reply_deadline(deadline: float | None) -> Iterator[None]:
    """Within the block, a script call on a plain client waits for its reply (and
    re-sends) only until ``deadline`` (a ``time.monotonic()`` instant; None: no cap),
    then raises :class:`DeadlinePassed` -- a blocked read never outlives the caller's
    deadline (redis-py's own socket timeout, 5 s by default, would)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    """The deadline :func:`reply_deadline` set for script calls here (None: none); the
    async calls (``celery_redislock.asyncio.calls``) obey the same one."""
    return _DEADLINE.get()


class LuaScript:
    """One ``.lua`` file of the core, callable as ``script(client, keys, args)``.

    ``constants`` fill the script's ``{{NAME}}`` placeholders; one left unfilled is
    an error at import, never a broken script at run time.

    Replies are read by shape: a script whose text defines ``local STAMP = '<code>'
    .. string.sub(ARGV[1], 1, 8)`` answers ``{stamp, reply}``; :meth:`checked` returns
    ``reply`` only when ``stamp`` is this script's code and the first 8 characters of
    this call's first argument (a token or a per-call nonce), so another command's
    reply left on a connection (an interrupt between sending and reading) is never
    taken for this one's -- a bare 1 from anything is not a grant.
    """

    __slots__ = ("_code", "code", "head", "name", "sha", "text")

    def __init__(self, filename: str, constants: Mapping[str, int] | None = None) -> None:
        self.name = filename
        self.text = fill(filename, expand(filename), constants or {})
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()
        match = _STAMP.search(self.text)
        self.code = match[1] if match else None
        self._code = self.code.encode() if self.code else b""
        self.head = evalsha_head(self.sha)  # see .resp.pack_evalsha

    def __call__(
        self,
        client: Any,
        keys: list[Any],
        args: list[Any],
        *,
        with_text: bool = False,
        sends: list[None] | None = None,
    ) -> Any:
        """Run the script on ``client`` in one round trip (two after a NOSCRIPT).

        ``with_text``: send EVAL with the script's text at once, for a caller that
        cannot afford the NOSCRIPT round trip (the renewer's first call of a script).
        ``sends``: on a plain client (:func:`.kept.sees_resends`), one item per send; more than
        one: it was sent again after a lost (or foreign) reply and may have run before.

        On a plain client the call holds one connection itself (the thread's kept one,
        see :mod:`.kept`, else one from the pool): a connection interrupted mid-command
        (``KeyboardInterrupt``, an exception from a signal handler) is closed, never
        used again with an unread reply (redis-py guards only its own read, not the
        gap after sending), and a reply with the
        wrong stamp closes the connection and sends the call again (every script
        answers a re-send as its first execution). redis-py's ``Retry`` re-sends on
        ``ConnectionError``/``TimeoutError`` as for any command.
        """
        pool = getattr(client, "connection_pool", None)
        if pool is None or getattr(client, "connection", None) is not None:
            return self._via_client(client, keys, args, with_text)  # cluster, one connection
        deadline = _DEADLINE.get()
        # Packed before a connection is taken: an argument that cannot be encoded
        # raises with no connection out of the pool and none left marked busy.
        packed = pack_evalsha(self.head, keys, args, key_encoder(client))
        kept = kept_connection(client, pool)
        conn = pool.get_connection() if kept is None else kept.conn

        def failed(_error: BaseException) -> None:
            conn.disconnect()
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlinePassed(f"{self.name}: Redis did not answer before the deadline")

        def attempt() -> Any:
            return self._on(conn, packed, keys, args, deadline, with_text, sends)

        try:
            if kept is not None and conn._sock is not None:
                try:
                    return conn.retry.call_with_retry(attempt, failed)
                except RedisConnectionError:  # closed while kept (a restart, CLIENT KILL):
                    conn.disconnect()  # once more, as the pool reconnects before a send
            return conn.retry.call_with_retry(attempt, failed)
        except BaseException as exc:
            if not isinstance(exc, RedisError):
                conn.disconnect()  # interrupted: a reply may be left unread
            raise
        finally:
            if kept is None:
                pool.release(conn)
            else:
                kept.used, kept.busy = time.monotonic(), False

    def _on(
        self,
        conn: Any,
        packed: bytes,
        keys: list[Any],
        args: list[Any],
        deadline: float | None,
        with_text: bool = False,
        sends: list[None] | None = None,
    ) -> Any:
        for attempt in (1, 2):
            if sends is not None:
                sends.append(None)
            try:
                if with_text:
                    raise NoScriptError("EVAL at once")  # the EVAL branch below
                _connect_by(conn, deadline)
                conn.send_packed_command([packed])
                reply = _read_reply(conn, deadline)
            except NoScriptError:
                conn.send_command("EVAL", self.text, len(keys), *keys, *args)
                reply = _read_reply(conn, deadline)
            if self.code is None or self._stamped(reply, args):
                return reply if self.code is None else reply[1]
            conn.disconnect()  # it held another command's reply: never use it again
            if attempt == 2:
                break
        raise StaleReply(f"{self.name}: the reply is not this call's: {reply!r:.200}")

    def _via_client(
        self, client: Any, keys: list[Any], args: list[Any], with_text: bool = False
    ) -> Any:
        for _ in (1, 2):
            try:
                try:
                    if with_text:
                        raise NoScriptError("EVAL at once")  # the EVAL branch below
                    # What client.evalsha() does, without its two layers of re-packed
                    # *args (a RedisCluster routes EVALSHA by its keys either way).
                    reply = client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
                except NoScriptError:
                    reply = client.eval(self.text, len(keys), *keys, *args)
            except BaseException as exc:
                if not isinstance(exc, RedisError):
                    discard_idle_connections(client)
                raise
            if self.code is None or self._stamped(reply, args):
                return reply if self.code is None else reply[1]
            discard_idle_connections(client)
        raise StaleReply(f"{self.name}: the reply is not this call's: {reply!r:.200}")

    def checked(self, reply: Any, args: list[Any]) -> Any:
        """The payload of ``reply`` to a call with ``args``; :class:`StaleReply` when
        it is not that call's (for callers that send the script themselves)."""
        if self.code is None:
            return reply
        if not self._stamped(reply, args):
            raise StaleReply(f"{self.name}: the reply is not this call's: {reply!r:.200}")
        return reply[1]

    def _stamped(self, reply: Any, args: list[Any]) -> bool:
        if reply.__class__ is not list or len(reply) != 2:
            return False
        # Lua's string.sub counts bytes: compare the first 8 bytes of the argument as
        # sent (redis-py sends a str as UTF-8, a number as its digits).
        stamp, first = reply[0], args[0] if args else b""
        if first.__class__ is not bytes:
            first = str(first).encode("utf-8")
        if stamp.__class__ is not bytes:
            stamp = str(stamp).encode("utf-8")
        return bool(stamp == self._code + first[:8])

    def __repr__(self) -> str:
        return f"<LuaScript {self.name} {self.sha[:8]}>"


def _read_reply(conn: Any, deadline: float | None) -> Any:
    if deadline is None:
        return conn.read_response()
    # A socket timeout raises redis' TimeoutError (and disconnects): retried by the
    # Retry, whose failure callback ends the call once the deadline passed. A call made
    # at its deadline (a waiter's last look) still gets a round trip's worth of time.
    # Never longer than the client's own socket_timeout: a waiter must give up on a
    # frozen primary in time to reach the replica a failover promotes.
    timeout = max(_LAST_LOOK, deadline - time.monotonic())
    socket_timeout = getattr(conn, "socket_timeout", None)
    if socket_timeout is not None:
        timeout = min(timeout, socket_timeout)
    cls = conn.__class__
    takes = _TAKES_TIMEOUT.get(cls)
    if takes is None:
        takes = _TAKES_TIMEOUT[cls] = "timeout" in inspect.signature(cls.read_response).parameters
    if takes:
        return conn.read_response(timeout=timeout)
    # redis-py < 8 reads take no timeout: set it on the socket for this read, as
    # redis-py 8 does itself; a socket timeout still raises redis' TimeoutError and
    # disconnects (``_sock`` then is None, or a new socket: leave that one alone).
    sock = conn._sock
    if sock is None:
        return conn.read_response()  # redis-py raises its ConnectionError
    sock.settimeout(timeout)
    try:
        return conn.read_response()
    finally:
        if conn._sock is sock:
            sock.settimeout(socket_timeout)


def _connect_by(conn: Any, deadline: float | None) -> None:
    """Connect ``conn`` if it is not, its handshake (HELLO, CLIENT) capped by
    ``deadline``: redis-py reads it under its own socket timeout (5 s), which a
    reconnect after a timed-out read (the leave that follows one) would wait out."""
    if deadline is None or getattr(conn, "_sock", True) is not None:
        return
    cap = max(_LAST_LOOK, deadline - time.monotonic())
    saved = conn.socket_timeout, conn.socket_connect_timeout
    conn.socket_timeout = cap if saved[0] is None else min(saved[0], cap)
    conn.socket_connect_timeout = cap if saved[1] is None else min(saved[1], cap)
    try:  # once: the caller's Retry re-sends, and stops at the deadline (connect()
        # would retry the handshake itself, 10 times by default)
        check = getattr(conn, "connect_check_health", None)
        if check is not None and "retry_socket_connect" in inspect.signature(check).parameters:
            check(check_health=True, retry_socket_connect=False)
        else:
            conn.connect()
    finally:
        conn.socket_timeout, conn.socket_connect_timeout = saved
        if conn._sock is not None:
            conn._sock.settimeout(saved[0])


# Per connection class: does its read_response() take ``timeout`` (redis-py >= 8)?
_TAKES_TIMEOUT: dict[type, bool] = {}


def discard_idle_connections(client: Any) -> None:
    """Close the idle pooled connections of ``client`` (every node's on a cluster):
    one of them may hold a reply nobody will read."""
    pools = []
    if getattr(client, "connection_pool", None) is not None:
        pools.append(client.connection_pool)
    for node in getattr(client, "get_nodes", lambda: [])():
        connection = getattr(node, "redis_connection", None)
        if connection is not None:
            pools.append(connection.connection_pool)
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.disconnect(inuse_connections=False)


def as_text(value: Any) -> str:
    """A reply element as ``str``, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
