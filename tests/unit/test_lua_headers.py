"""Every Lua script documents its KEYS, ARGV and return values, and is loaded whole."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import pytest

from celery_redislock.core.scripts import LuaScript

LUA = resources.files("celery_redislock.core.lua")
SCRIPTS = sorted(
    entry.name
    for entry in LUA.iterdir()
    if entry.name.endswith(".lua") and not entry.name.startswith("lib_")
)


def header_and_body(text: str) -> tuple[str, str]:
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))
    return "\n".join(lines[:end]), "\n".join(lines[end:])


def test_the_lock_scripts_exist() -> None:
    for name in ("lock_acquire.lua", "lock_release.lua", "lock_extend.lua",
                 "lock_adopt.lua", "lock_info.lua", "queue_leave.lua"):  # fmt: skip
        assert name in SCRIPTS


@pytest.mark.parametrize("filename", SCRIPTS)
def test_header_names_every_key_and_argument(filename: str) -> None:
    header, body = header_and_body(LUA.joinpath(filename).read_text("utf-8"))
    assert header.startswith(f"-- {filename}:"), "first line: the file name and what it does"
    for kind in ("KEYS", "ARGV"):
        used = set(re.findall(rf"{kind}\[(\d+)\]", body))
        documented = set(re.findall(rf"^--\s+{kind}\[(\d+)\]", header, re.MULTILINE))
        assert used <= documented, f"{filename}: {kind} {sorted(used - documented)} undocumented"
    assert re.search(r"^--\s+Returns", header, re.MULTILINE), f"{filename}: no 'Returns'"


@pytest.mark.parametrize("filename", SCRIPTS)
def test_script_is_loaded_with_its_includes_expanded(filename: str) -> None:
    script = LuaScript(filename)
    assert not re.search(r"^--!include", script.text, re.MULTILINE)
    assert script.sha == hashlib.sha1(script.text.encode("utf-8")).hexdigest()
    for include in re.findall(r"^--!include (\S+)", LUA.joinpath(filename).read_text("utf-8"),
                              re.MULTILINE):  # fmt: skip
        assert LUA.joinpath(include).read_text("utf-8").strip() in script.text
