"""Lua scripts from ``core/lua/``: read once, run by EVALSHA, NOSCRIPT recovered.

Each script is read, expanded and hashed once at import, and reaches Redis as one
self-contained source (includes and constants: :mod:`.lua_text`).

A call sends ``EVALSHA``; when the server answers NOSCRIPT (a restart, a failover or
``SCRIPT FLUSH`` emptied its cache) the same call is re-sent as ``EVAL``, which runs
the script and caches it again. A NOSCRIPT reply means the script did not run, so
the retry cannot apply it twice.

Everything here goes through redis-py's public API: a pool's ``get_connection`` /
``release``, and a connection's ``send_command`` / ``can_read`` / ``read_response``
/ ``connect_check_health`` / ``disconnect`` (all in redis-py 6.4, our floor).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeAlias, TypeGuard

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, KeyT

from ..errors import RedisLockError
from .clients import AnyRedisClient, RedisClient, cluster_nodes
from .kept import Kept, ScriptConnection, kept_connection, sees_resends
from .lua_text import expand, fill

__all__ = [
    "DeadlinePassed",
    "LuaScript",
    "RedisClient",
    "ScriptReply",
    "StaleReply",
    "as_text",
    "discard_idle_connections",
    "expand",
    "key_encoder",
    "reply_array",
    "reply_deadline",
    "reply_int",
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
    re-sends, and reconnects) only until ``deadline`` (a ``time.monotonic()``
    instant; None: no cap), then raises :class:`DeadlinePassed` -- a blocked read
    never outlives the caller's deadline (redis-py's own socket timeout, 5 s by
    default, would). The async calls (``celery_redislock.asyncio``) obey it too."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


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

    __slots__ = ("_code", "code", "name", "sha", "text")

    def __init__(self, filename: str, constants: Mapping[str, int] | None = None) -> None:
        self.name = filename
        self.text = fill(filename, expand(filename), constants or {})
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()
        match = _STAMP.search(self.text)
        self.code = match[1] if match else None
        self._code = self.code.encode() if self.code else b""

    def __call__(
        self,
        client: RedisClient,
        keys: Sequence[KeyT],
        args: Sequence[EncodableT],
        *,
        with_text: bool = False,
        sends: list[None] | None = None,
    ) -> ScriptReply:
        """Run the script on ``client`` in one round trip (two after a NOSCRIPT).

        ``with_text``: send EVAL with the script's text at once, for a caller that
        cannot afford the NOSCRIPT round trip (the renewer's first call of a script).
        ``sends``: on a plain client (:func:`.kept.sees_resends`), one item per send;
        more than one: it was sent again after a lost (or foreign) reply and may have
        run before.

        On a plain client the call holds one connection itself (the thread's kept one,
        see :mod:`.kept`, else one from the pool): a connection interrupted mid-command
        (``KeyboardInterrupt``, an exception from a signal handler) is closed, never
        used again with an unread reply (redis-py guards only its own read, not the
        gap after sending), and a reply with the wrong stamp closes the connection and
        sends the call again (every script answers a re-send as its first execution).
        redis-py's ``Retry`` re-sends on ``ConnectionError``/``TimeoutError`` as for
        any command.
        """
        if not isinstance(client, Redis) or client.connection is not None:
            return self._via_client(client, keys, args, with_text)  # cluster, one connection
        pool = client.connection_pool
        kept = kept_connection(client, pool)
        if kept is not None:
            return _Call(self, kept.call_view, kept, keys, args, with_text, sends).run()
        conn = pool.get_connection()
        call = _Call(self, conn, None, keys, args, with_text, sends)
        try:
            return call.run()
        finally:
            if call.capped:
                call.conn.disconnect()  # its socket has the deadline's short timeout
            pool.release(conn)

    def _via_client(
        self,
        client: RedisClient,
        keys: Sequence[KeyT],
        args: Sequence[EncodableT],
        with_text: bool = False,
    ) -> ScriptReply:
        for _ in (1, 2):
            try:
                reply = self._send_via(client, keys, args, with_text)
            except BaseException as exc:
                if not isinstance(exc, RedisError):
                    discard_idle_connections(client)
                raise
            if self.code is None:
                return reply
            if self._stamped(reply, args):
                return reply[1]
            discard_idle_connections(client)
        raise StaleReply(f"{self.name}: the reply is not this call's: {reply!r:.200}")

    def _send_via(
        self, client: RedisClient, keys: Sequence[KeyT], args: Sequence[EncodableT], with_text: bool
    ) -> ScriptReply:
        # The boundary: redis-py annotates evalsha/eval (and read_response) as Any; a
        # script's reply is one of the RESP values ScriptReply names.
        reply: ScriptReply
        if not with_text:
            try:
                reply = client.evalsha(self.sha, len(keys), *keys, *args)
                return reply
            except NoScriptError:
                pass
        reply = client.eval(self.text, len(keys), *keys, *args)
        return reply

    def checked(self, reply: Any, args: Sequence[EncodableT]) -> ScriptReply:
        """The payload of ``reply`` to a call with ``args``; :class:`StaleReply` when
        it is not that call's (for callers that send the script themselves)."""
        if self.code is not None and not self._stamped(reply, args):
            raise StaleReply(f"{self.name}: the reply is not this call's: {reply!r:.200}")
        payload: ScriptReply = reply if self.code is None else reply[1]
        return payload

    def _stamped(self, reply: object, args: Sequence[EncodableT]) -> TypeGuard[list[ScriptReply]]:
        if not isinstance(reply, list) or len(reply) != 2:
            return False
        # Lua's string.sub counts bytes: compare the first 8 bytes of the argument as
        # sent (redis-py sends a str as UTF-8, a number as its digits).
        stamp, first = reply[0], args[0] if args else b""
        if not isinstance(first, bytes):
            first = str(first).encode("utf-8")
        if not isinstance(stamp, bytes):
            stamp = str(stamp).encode("utf-8")
        return bool(stamp == self._code + first[:8])

    def __repr__(self) -> str:
        return f"<LuaScript {self.name} {self.sha[:8]}>"


class _Call:
    """One script call on one connection of a plain client, under the deadline of
    :func:`reply_deadline` (if any), with redis-py's ``Retry`` of the client."""

    __slots__ = (
        "args",
        "capped",
        "conn",
        "deadline",
        "keep",
        "keys",
        "reconnect",
        "script",
        "sends",
        "text",
    )

    def __init__(
        self,
        script: LuaScript,
        conn: ScriptConnection,
        keep: Kept | None,
        keys: Sequence[KeyT],
        args: Sequence[EncodableT],
        with_text: bool,
        sends: list[None] | None,
    ) -> None:
        self.script, self.conn, self.keep = script, conn, keep
        self.keys, self.args, self.text, self.sends = keys, args, with_text, sends
        self.deadline = _DEADLINE.get()
        self.capped = False  # connected here with timeouts lowered to the deadline
        # Not connected (closed by a failure): connect under the deadline's cap.
        self.reconnect = keep is not None and not keep.connected

    def run(self) -> ScriptReply:
        conn, keep = self.conn, self.keep
        try:
            if keep is not None and keep.capped and self.deadline is None:
                # Connected under a deadline: its socket still has that short
                # timeout, which would time out this uncapped read. Reconnect.
                conn.disconnect()
                keep.connected = keep.capped = False
            if keep is not None and keep.connected:
                try:
                    return conn.retry.call_with_retry(self.attempt, self.failed)
                except RedisConnectionError:  # closed while kept (a restart, CLIENT
                    conn.disconnect()  # KILL): once more, as a pool reconnects one
            return conn.retry.call_with_retry(self.attempt, self.failed)
        except BaseException:
            # Interrupted, or failed: a reply may be left unread, or redis-py closed
            # it already. Closed either way, so the next call knows to (re)connect.
            conn.disconnect()
            if keep is not None:
                keep.connected = False
            raise
        finally:
            if keep is not None:
                keep.capped = keep.capped or self.capped
                keep.done()

    def failed(self, _error: BaseException) -> None:
        self.conn.disconnect()
        self.reconnect = True
        if self.keep is not None:
            self.keep.connected = False
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlinePassed(f"{self.script.name}: Redis did not answer before the deadline")

    def attempt(self) -> ScriptReply:
        conn, script, keys, args = self.conn, self.script, self.keys, self.args
        keep = self.keep
        if self.reconnect and self.deadline is not None:
            self._connect()  # after a failure, or a kept connection closed by the last call
        self.reconnect = False
        for attempt in (1, 2):
            if self.sends is not None:
                self.sends.append(None)
            try:
                if self.text:
                    raise NoScriptError("EVAL at once")  # the EVAL branch below
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                reply = self._read()
            except NoScriptError:
                conn.send_command("EVAL", script.text, len(keys), *keys, *args)
                reply = self._read()
            if keep is not None:
                keep.connected = True
            if script.code is None or script._stamped(reply, args):
                payload: ScriptReply = reply if script.code is None else reply[1]
                return payload
            conn.disconnect()  # it held another command's reply: never use it again
            if keep is not None:
                keep.connected = False
            if attempt == 2:
                break
        raise StaleReply(f"{script.name}: the reply is not this call's: {reply!r:.200}")

    def _read(self) -> Any:
        """The reply, waited for no longer than the deadline (a call made at its
        deadline, a waiter's last look, still gets a round trip's worth of time) and
        never longer than the connection's own socket timeout: a waiter must give up
        on a frozen primary in time to reach the replica a failover promotes."""
        conn, deadline = self.conn, self.deadline
        if deadline is not None:
            wait = max(_LAST_LOOK, deadline - time.monotonic())
            socket_timeout = conn.socket_timeout
            if socket_timeout is not None and wait >= socket_timeout:
                if not (self.capped or (self.keep is not None and self.keep.capped)):
                    return conn.read_response()  # the socket's own timeout caps it
                wait = socket_timeout  # the socket's timeout is a past deadline's
            if not conn.can_read(timeout=wait):
                conn.disconnect()  # the reply may still come: never read as another's
                raise RedisTimeoutError(f"{self.script.name}: no reply within {wait:.3f} s")
        return conn.read_response()

    def _connect(self) -> None:
        """Connect (if it is not) with the handshake (HELLO, CLIENT) capped by the
        deadline: redis-py reads it under its own socket timeout (5 s by default),
        which a reconnect after a timed-out read (the leave that follows one) would
        wait out. Once: the caller's Retry re-sends, and stops at the deadline."""
        assert self.deadline is not None
        conn = self.conn
        cap = max(_LAST_LOOK, self.deadline - time.monotonic())
        saved = conn.socket_timeout, conn.socket_connect_timeout
        conn.socket_timeout = cap if saved[0] is None else min(saved[0], cap)
        conn.socket_connect_timeout = cap if saved[1] is None else min(saved[1], cap)
        try:
            conn.connect_check_health(check_health=True, retry_socket_connect=False)
        finally:
            conn.socket_timeout, conn.socket_connect_timeout = saved
        # The socket keeps the lowered timeout until it is closed: the kept
        # connection is reconnected before an uncapped call, a pooled one is closed
        # before it goes back (see run).
        self.capped = True
        if self.keep is not None:
            self.keep.connected = True


def discard_idle_connections(client: RedisClient) -> None:
    """Close the idle pooled connections of ``client`` (every node's on a cluster):
    one of them may hold a reply nobody will read."""
    pools = []
    if isinstance(client, RedisCluster):
        for node in cluster_nodes(client):
            if node.redis_connection is not None:
                pools.append(node.redis_connection.connection_pool)
    else:
        pools.append(client.connection_pool)
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.disconnect(inuse_connections=False)


def key_encoder(client: AnyRedisClient) -> Callable[[EncodableT], bytes]:
    """``client``'s own encoder (sync or asyncio): what redis-py sends for a value (a
    str in the client's encoding), for keys encoded once and sent as bytes."""
    # redis-py's Encoder is untyped (and private): typed here, at our boundary.
    encode: Callable[[EncodableT], bytes] = client.get_encoder().encode
    return encode


ScriptReply: TypeAlias = "int | bytes | str | list[ScriptReply] | None"
"""A Lua script's reply (its payload, the stamp taken off) as redis-py gives it: Lua
integers (and true) as int, strings as bytes (str on a client that decodes
responses), tables as arrays of these, nil (and false) as None. Read it through
:func:`reply_int`, :func:`reply_array` and :func:`as_text`, as the script's header
describes it."""


def reply_int(value: ScriptReply) -> int:
    """An element a script's header says is an integer, as ``int()`` reads it (a
    string of digits too); ``TypeError`` for an array or nil, as ``int()`` raises."""
    if isinstance(value, list) or value is None:
        raise TypeError(f"a script reply: expected an integer, got {value!r:.200}")
    return int(value)


def reply_array(value: ScriptReply) -> list[ScriptReply]:
    """A reply a script's header says is an array; ``TypeError`` for anything else."""
    if not isinstance(value, list):
        raise TypeError(f"a script reply: expected an array, got {value!r:.200}")
    return value


def as_text(value: object) -> str:
    """A reply element as ``str``, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
