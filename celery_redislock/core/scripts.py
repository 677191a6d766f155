"""Lua scripts from ``core/lua/``: read once, run by EVALSHA, NOSCRIPT recovered.

Each script is read, expanded and hashed once at import, and reaches Redis as one
self-contained source:

* ``--!include lib.lua`` lines bring in the helpers (the top-level ``local
  function``\\ s) of a shared file, but only those the script calls: every helper
  defined is a closure Redis makes each time the script runs. A group of adjacent
  include lines defines the helpers that the code after it, up to the next group,
  calls (directly or through other helpers) and that no earlier group defined. So a
  script can put its common case first, under an include of the few helpers it
  needs, and include again before the rest: a call that returns early never makes
  the other closures. Code that calls a helper before its include, and a helper
  that calls one not defined above it (a lib not included yet), are errors at
  import: Lua would read the name as a global, nil when that path runs.
* ``{{NAME}}`` is replaced by the constant ``NAME`` the script was built with (an
  int), so settings that never vary are not sent as arguments on every call while
  their one definition stays in Python.

A call sends ``EVALSHA``; when the server answers NOSCRIPT (a restart, a failover or
``SCRIPT FLUSH`` emptied its cache) the same call is re-sent as ``EVAL``, which runs
the script and caches it again. A NOSCRIPT reply means the script did not run, so
the retry cannot apply it twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import RedisLockError

__all__ = ["DeadlinePassed", "LuaScript", "StaleReply", "as_text", "discard_idle_connections",
           "current_deadline", "expand", "key_encoder", "reply_deadline"]

_LUA_PACKAGE = "celery_redislock.core.lua"
_INCLUDE = "--!include "
_HELPER = re.compile(r"local function (\w+)\(")
_STAMP = re.compile(r"^local STAMP = '(\w+)' \.\. string\.sub\(ARGV\[1\], 1, 8\)$", re.M)
_CONSTANT = re.compile(r"\{\{(\w+)\}\}")
_NAME = re.compile(r"[A-Za-z_]\w*")
# A name called as a function (not a field: ``string.format(``), and the names a
# helper may call besides the helpers above it: Lua's keywords and base functions.
_CALL = re.compile(r"(?<![\w.:])([A-Za-z_]\w*)\s*\(")
_NOT_HELPERS = frozenset((
    "and", "elseif", "function", "if", "in", "local", "not", "or", "return", "until",
    "while",  # keywords
    "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal",
    "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring", "type",
    "unpack", "xpcall",  # base functions
))  # fmt: skip
# A Lua string literal, or a comment (to the end of the line).
_STRING_OR_COMMENT = re.compile(r"""'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|--[^\n]*""")


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

    __slots__ = ("_code", "code", "name", "sha", "text")

    def __init__(self, filename: str, constants: Mapping[str, int] | None = None) -> None:
        self.name = filename
        self.text = _fill(filename, expand(filename), constants or {})
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()
        match = _STAMP.search(self.text)
        self.code = match[1] if match else None
        self._code = self.code.encode() if self.code else b""

    def __call__(
        self, client: Any, keys: list[Any], args: list[Any], *, with_text: bool = False
    ) -> Any:
        """Run the script on ``client`` in one round trip (two after a NOSCRIPT).

        ``with_text``: send EVAL with the script's text at once, for a caller that
        cannot afford the NOSCRIPT round trip (the renewer's first call of a script).

        On a plain client the call holds one pooled connection itself: a connection
        interrupted mid-command (``KeyboardInterrupt``, an exception from a signal
        handler) is closed, never returned to the pool with an unread reply (redis-py
        guards only its own read, not the gap after sending), and a reply with the
        wrong stamp closes the connection and sends the call again (every script
        answers a re-send as its first execution). redis-py's ``Retry`` re-sends on
        ``ConnectionError``/``TimeoutError`` as for any command.
        """
        pool = getattr(client, "connection_pool", None)
        if pool is None or getattr(client, "connection", None) is not None:
            return self._via_client(client, keys, args, with_text)  # cluster, one connection
        deadline = _DEADLINE.get()
        conn = pool.get_connection()

        def failed(_error: BaseException) -> None:
            conn.disconnect()
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlinePassed(f"{self.name}: Redis did not answer before the deadline")

        try:
            return conn.retry.call_with_retry(
                lambda: self._on(conn, keys, args, deadline, with_text), failed
            )
        except BaseException as exc:
            if not isinstance(exc, RedisError):
                conn.disconnect()  # interrupted: a reply may be left unread
            raise
        finally:
            pool.release(conn)

    def _on(self, conn: Any, keys: list[Any], args: list[Any], deadline: float | None,
            with_text: bool = False) -> Any:  # fmt: skip
        for attempt in (1, 2):
            try:
                if with_text:
                    raise NoScriptError("EVAL at once")  # the EVAL branch below
                conn.send_command("EVALSHA", self.sha, len(keys), *keys, *args)
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

    def _via_client(self, client: Any, keys: list[Any], args: list[Any],
                    with_text: bool = False) -> Any:  # fmt: skip
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
    return conn.read_response(timeout=timeout)


_ENCODERS: dict[int, Callable[[Any], bytes]] = {}


def key_encoder(client: Any) -> Callable[[Any], bytes]:
    """``client``'s own encoder (what redis-py sends for a str), made once per client:
    ``get_encoder()`` builds a new one from the pool's settings on every call, and
    locks are built per call (``with RedisLock(client, f"user:{uid}")``)."""
    encode = _ENCODERS.get(id(client))
    if encode is None:
        encode = _ENCODERS[id(client)] = client.get_encoder().encode
        weakref.finalize(client, _ENCODERS.pop, id(client), None)
    return encode


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


def expand(filename: str) -> str:
    """The text of script ``filename`` with its includes expanded (see the module
    docstring), its ``{{NAME}}`` placeholders left in."""
    # The script as code segments (str) and groups of adjacent include lines (their libs).
    segments: list[str | list[str]] = []
    for line in _read(filename).splitlines():
        if line.startswith(_INCLUDE):
            lib = line[len(_INCLUDE) :].strip()
            if segments and isinstance(segments[-1], list):
                segments[-1].append(lib)
            else:
                segments.append([lib])
        elif segments and isinstance(segments[-1], str):
            segments[-1] += line + "\n"
        else:
            segments.append(line + "\n")
    every: dict[str, str] = {}  # the helpers of every lib the script names
    for segment in segments:
        if isinstance(segment, list):
            for lib in segment:
                every.update(_helpers(lib))
    available: dict[str, str] = {}  # those of the libs named so far, in order
    defined: set[str] = set()
    text = []
    for index, segment in enumerate(segments):
        if isinstance(segment, str):
            if missing := _calls(segment, every) - defined:
                raise ValueError(f"{filename}: {sorted(missing)} called before an include")
            text.append(segment)
            continue
        for lib in segment:
            available.update(_helpers(lib))
        code = segments[index + 1] if index + 1 < len(segments) else ""
        assert isinstance(code, str)  # adjacent include lines make one group
        wanted = _needed(code, available) - defined
        for name, definition in available.items():
            if name not in wanted:
                continue
            # A helper sees only the helpers defined above it (any other name is a
            # global, nil in Redis): one of a lib not included yet, or defined later
            # in the text, would fail only when that path runs.
            called = set(_CALL.findall(_STRING_OR_COMMENT.sub(" ", definition)))
            if late := called - _NOT_HELPERS - defined - {name}:
                raise ValueError(f"{filename}: helper {name} calls {sorted(late)} "
                                 "before they are defined")  # fmt: skip
            text.append(definition)
            defined.add(name)
    return "".join(text)


def _read(filename: str) -> str:
    return resources.files(_LUA_PACKAGE).joinpath(filename).read_text("utf-8")


def _helpers(filename: str) -> dict[str, str]:
    """The helpers of lib ``filename`` by name, in file order, each with the comment
    lines right above it. A lib holds nothing else but comments and blank lines; a
    helper ends at the first line that is exactly ``end``."""
    helpers: dict[str, str] = {}
    comment: list[str] = []
    body: list[str] | None = None
    name = ""
    for line in _read(filename).splitlines():
        if body is not None:
            if _HELPER.match(line):
                raise ValueError(f"{filename}: helper {name} has no unindented 'end'")
            body.append(line)
            if line == "end":
                helpers[name] = "\n".join(body) + "\n\n"  # a blank line after each
                body, comment = None, []
        elif match := _HELPER.match(line):
            name, body = match[1], [*comment, line]
        elif line.startswith("--"):
            comment.append(line)
        elif not line.strip():
            comment = []
        else:
            raise ValueError(f"{filename}: only helpers may be at the top level: {line!r}")
    if body is not None:
        raise ValueError(f"{filename}: helper {name} has no unindented 'end'")
    return helpers


def _calls(code: str, helpers: Mapping[str, str]) -> set[str]:
    """The helpers named in ``code`` outside its comments and string literals."""
    stripped = _STRING_OR_COMMENT.sub(" ", code)
    return {name for name in _NAME.findall(stripped) if name in helpers}


def _needed(code: str, helpers: Mapping[str, str]) -> set[str]:
    """The helpers ``code`` calls, with those they call in turn."""
    needed: set[str] = set()
    todo = _calls(code, helpers)
    while todo:
        name = todo.pop()
        needed.add(name)
        todo |= _calls(helpers[name], helpers) - needed
    return needed


def _fill(filename: str, text: str, constants: Mapping[str, int]) -> str:
    def value(match: re.Match[str]) -> str:
        if match[1] not in constants:
            raise ValueError(f"{filename}: no value for constant {match[1]}")
        return f"{constants[match[1]]:d}"

    return _CONSTANT.sub(value, text)


def as_text(value: Any) -> str:
    """A reply element as ``str``, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
