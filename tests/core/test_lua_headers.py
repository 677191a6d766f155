"""Every Lua script documents its KEYS, ARGV and return values, and is loaded whole."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path

import pytest

from celery_redislock.core import lua_text, scripts
from celery_redislock.core.parking import PARKING_CONSTANTS
from celery_redislock.core.scripts import LuaScript, expand

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
    for name in (
        "lock_acquire.lua",
        "lock_release.lua",
        "lock_extend.lua",
        "lock_adopt.lua",
        "lock_info.lua",
        "queue_leave.lua",
    ):
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
def test_header_names_every_constant(filename: str) -> None:
    header, _ = header_and_body(LUA.joinpath(filename).read_text("utf-8"))
    for constant in set(re.findall(r"\{\{(\w+)\}\}", expand(filename))):
        assert re.search(rf"^--.*\b{constant}\b", header, re.MULTILINE), (
            f"{filename}: constant {constant} undocumented"
        )


@pytest.mark.parametrize("filename", SCRIPTS)
def test_script_is_loaded_with_its_includes_expanded(filename: str) -> None:
    script = LuaScript(filename, PARKING_CONSTANTS)
    assert not re.search(r"^--!include", script.text, re.MULTILINE)
    assert "{{" not in script.text
    assert script.sha == hashlib.sha1(script.text.encode("utf-8")).hexdigest()
    # Every helper the script calls is defined, each once, and no other.
    defined = re.findall(r"^local function (\w+)\(", script.text, re.MULTILINE)
    assert len(defined) == len(set(defined))
    source = LUA.joinpath(filename).read_text("utf-8")
    helpers = {
        name
        for lib in re.findall(r"^--!include (\S+)", source, re.MULTILINE)
        for name in helper_names(lib)
    }
    code = re.sub(r"--[^\n]*|local function \w+\(", "", script.text)
    called = {name for name in helpers if re.search(rf"\b{name}\(", code)}
    assert called == set(defined) & helpers


def helper_names(lib: str) -> list[str]:
    return re.findall(r"^local function (\w+)\(", LUA.joinpath(lib).read_text("utf-8"), re.M)


def test_only_the_helpers_a_script_calls_are_included() -> None:
    extend = expand("lock_extend.lua")
    assert re.findall(r"^local function (\w+)", extend, re.MULTILINE) == [
        "server_clock",
        "sweep_leases",
        "extend_lease",
    ]
    assert "enqueue_waiter" not in extend and "lib_lock.lua" not in extend
    # lib_semaphore.lua's helpers call lib_lock.lua's: those come along, in order.
    release = re.findall(r"^local function (\w+)", expand("semaphore_release.lua"), re.MULTILINE)
    assert release.index("next_fence") < release.index("hand_over_permits")
    assert "extend_lease" not in release


def test_includes_expand_by_the_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = """-- lib_t.lua: a test lib.

-- One.
local function one()
  return 1
end

-- Two calls one.
local function two()
  return one() + 1
end

local function three()
  return 3
end
"""
    files = {
        "lib_t.lua": lib,
        "a.lua": "--!include lib_t.lua\nlocal x = two() -- three()\n"
        "--!include lib_t.lua\nreturn x + one() + three() + #'two()'\n",
        "early.lua": "local x = one()\n--!include lib_t.lua\nreturn x\n",
        "unknown.lua": "--!include lib_t.lua\nreturn {{NOPE}}\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, "utf-8")
    monkeypatch.setattr(lua_text, "_read", lambda name: (tmp_path / name).read_text("utf-8"))
    text = scripts.expand("a.lua")
    # The first include defines every helper of the lib that the script calls
    # anywhere (comments and strings aside), in the lib's order; the second nothing.
    first, second = text.split("local x = two()")
    assert re.findall(r"local function (\w+)", first) == ["one", "two", "three"]
    assert re.findall(r"local function (\w+)", second) == []
    assert "-- Two calls one." in first
    with pytest.raises(ValueError, match="called before an include"):
        scripts.expand("early.lua")
    with pytest.raises(ValueError, match="no value for constant NOPE"):
        LuaScript("unknown.lua", {"OTHER": 1})
    assert "return 7" in LuaScript("unknown.lua", {"NOPE": 7}).text
