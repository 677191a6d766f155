"""Lua scripts from ``core/lua/``: read once, run by EVALSHA, NOSCRIPT recovered.

Each script is read and hashed once at import. A line ``--!include lib.lua`` is
replaced by that file's text, so helpers shared by several scripts live in one file
while every script still reaches Redis as one self-contained source. A call sends
``EVALSHA``; when the server answers NOSCRIPT (a restart, a failover or ``SCRIPT
FLUSH`` emptied its cache) the same call is re-sent as ``EVAL``, which runs the script
and caches it again. A NOSCRIPT reply means the script did not run, so the retry
cannot apply it twice.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

__all__ = ["LuaScript", "as_text"]

_LUA_PACKAGE = "celery_redislock.core.lua"
_INCLUDE = "--!include "


class LuaScript:
    """One ``.lua`` file of the core, callable as ``script(client, keys, args)``."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, filename: str) -> None:
        self.name = filename
        self.text = _read_expanded(filename)
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """Run the script on ``client`` in one round trip (two after a NOSCRIPT)."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.text, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"<LuaScript {self.name} {self.sha[:8]}>"


def _read_expanded(filename: str) -> str:
    text = resources.files(_LUA_PACKAGE).joinpath(filename).read_text("utf-8")
    lines = []
    for line in text.splitlines():
        if line.startswith(_INCLUDE):
            lines.append(_read_expanded(line[len(_INCLUDE) :].strip()))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def as_text(value: Any) -> str:
    """A reply element as ``str``, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
