"""The include expansion checks the helpers it writes out, not only the script's code.

A helper that calls a helper of a lib not included yet, or one defined below it in the
text, would read that name as a global (nil in Redis) and fail only when that path
runs; the expansion refuses it at import instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from celery_redislock.core import lua_text, scripts
from celery_redislock.core.lock import SCRIPT_CONSTANTS
from celery_redislock.core.parking import PARKING_CONSTANTS

# wake_new (lib_semaphore.lua) calls notify (lib_lock.lua), which is not included.
_ONLY_SEMAPHORE_LIB = """--!include lib_semaphore.lua
wake_new('chan', {}, {'t.aa'}, '')
return 1
"""


@pytest.fixture
def only_semaphore_lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "only_sem.lua").write_text(_ONLY_SEMAPHORE_LIB, "utf-8")
    read = lua_text._read
    monkeypatch.setattr(
        lua_text,
        "_read",
        lambda name: (tmp_path / name).read_text("utf-8") if name == "only_sem.lua" else read(name),
    )
    return "only_sem.lua"


def test_a_helper_calling_an_undefined_helper_is_refused_at_import(
    only_semaphore_lib: str,
) -> None:
    with pytest.raises(ValueError, match=r"helper wake_new calls \['notify'\] before"):
        scripts.LuaScript(only_semaphore_lib, SCRIPT_CONSTANTS)


def test_such_a_script_fails_only_at_run_time_in_redis(r: redis.Redis) -> None:
    # What the expansion used to write out for it: the helper it wanted, unchecked.
    text = lua_text._helpers("lib_semaphore.lua")["wake_new"]
    text += _ONLY_SEMAPHORE_LIB.split("\n", 1)[1]
    with pytest.raises(redis.ResponseError, match="notify"):
        r.eval(text, 0)


@pytest.mark.parametrize(
    "filename",
    sorted(
        path.name
        for path in Path(scripts.__file__).with_name("lua").glob("*.lua")
        if not path.name.startswith("lib_")
    ),
)
def test_every_shipped_script_defines_each_helper_before_its_use(filename: str) -> None:
    scripts.LuaScript(filename, PARKING_CONSTANTS)  # raises if not
