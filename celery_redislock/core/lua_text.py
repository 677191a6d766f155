"""The text of a Lua script of ``core/lua/``: its includes expanded, its constants filled.

Each script is read, expanded and hashed once at import, and reaches Redis as one
self-contained source:

* ``--!include lib.lua`` brings in the helpers (the top-level ``local
  function``\\ s) of a shared file that the script calls (directly or through
  other helpers), at the first include of that file; a later include of it adds
  nothing. So the text holds no helper it never calls, nor constants only those
  use. Code that calls a helper before its include, and a helper that calls one
  not defined above it (a lib not included yet), are errors at import: Lua would
  read the name as a global, nil when that path runs.
* ``{{NAME}}`` is replaced by the constant ``NAME`` the script was built with (an
  int), so settings that never vary are not sent as arguments on every call while
  their one definition stays in Python.

Used by :class:`.scripts.LuaScript` once per script, at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources

__all__ = ["expand", "fill"]

_LUA_PACKAGE = "celery_redislock.core.lua"
_INCLUDE = "--!include "
_HELPER = re.compile(r"local function (\w+)\(")
_CONSTANT = re.compile(r"\{\{(\w+)\}\}")
_NAME = re.compile(r"[A-Za-z_]\w*")
# A name called as a function (not a field: ``string.format(``), and the names a
# helper may call besides the helpers above it: Lua's keywords and base functions.
_CALL = re.compile(r"(?<![\w.:])([A-Za-z_]\w*)\s*\(")
_NOT_HELPERS = frozenset(
    (
        "and",
        "elseif",
        "function",
        "if",
        "in",
        "local",
        "not",
        "or",
        "return",
        "until",
        "while",  # keywords
        "assert",
        "error",
        "getmetatable",
        "ipairs",
        "next",
        "pairs",
        "pcall",
        "rawequal",
        "rawget",
        "rawset",
        "select",
        "setmetatable",
        "tonumber",
        "tostring",
        "type",
        "unpack",
        "xpcall",  # base functions
    )
)
# A Lua string literal, or a comment (to the end of the line).
_STRING_OR_COMMENT = re.compile(r"""'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|--[^\n]*""")


def expand(filename: str) -> str:
    """The text of script ``filename`` with its includes expanded (see the module
    docstring), its ``{{NAME}}`` placeholders left in."""
    lines = _read(filename).splitlines()
    every: dict[str, str] = {}  # the helpers of every lib the script names
    for line in lines:
        if line.startswith(_INCLUDE):
            every.update(_helpers(line[len(_INCLUDE) :].strip()))
    code = "\n".join(line for line in lines if not line.startswith(_INCLUDE))
    wanted = _needed(code, every)
    defined: set[str] = set()
    text: list[str] = []
    for line in lines:
        if not line.startswith(_INCLUDE):
            if missing := _calls(line, every) - defined:
                raise ValueError(f"{filename}: {sorted(missing)} called before an include")
            text.append(line + "\n")
            continue
        for name, definition in _helpers(line[len(_INCLUDE) :].strip()).items():
            if name not in wanted or name in defined:
                continue
            # A helper sees only the helpers defined above it (any other name is a
            # global, nil in Redis): one of a lib not included yet, or defined later
            # in the text, would fail only when that path runs.
            called = set(_CALL.findall(_STRING_OR_COMMENT.sub(" ", definition)))
            if late := called - _NOT_HELPERS - defined - {name}:
                raise ValueError(
                    f"{filename}: helper {name} calls {sorted(late)} before they are defined"
                )
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


def fill(filename: str, text: str, constants: Mapping[str, int]) -> str:
    """``text`` with each ``{{NAME}}`` replaced by ``constants[NAME]``; a missing one raises."""

    def value(match: re.Match[str]) -> str:
        if match[1] not in constants:
            raise ValueError(f"{filename}: no value for constant {match[1]}")
        return f"{constants[match[1]]:d}"

    return _CONSTANT.sub(value, text)
