"""The walk from ``delay()`` to the lock script enters each module at most twice.

A profile hook records every time a call enters one of the package's modules from
another one (or from Celery), until redis-py sends the first command: the EVALSHA of
the lock's acquire script. docs/architecture.md lists the walk step by step.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from celery import Celery

from celery_redislock import SingletonTask

_PACKAGE = "celery_redislock"
_SENDS = ("execute_command", "send_command", "send_packed_command")  # client, connection


def _module(frame: FrameType | None) -> str | None:
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name == _PACKAGE or name.startswith(_PACKAGE + "."):
            return name
        frame = frame.f_back
    return None


def walk(call: Callable[[], Any]) -> list[str]:
    """The package modules ``call`` enters, in order, before its first Redis command."""
    entered: list[str] = []
    done = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal done
        if done or event != "call":
            return
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith("redis.") and frame.f_code.co_name in _SENDS:
            done = True
        elif name.startswith(_PACKAGE + ".") and _module(frame.f_back) != name:
            entered.append(name.removeprefix(_PACKAGE + "."))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    assert done, f"no Redis command was sent; entered {entered}"
    return entered


def _check(entered: list[str], where: str = "") -> None:
    counts = Counter(name for name in entered if name.startswith(where))
    twice = {name: n for name, n in counts.items() if n > 2}
    assert not twice, f"entered more than twice: {twice}; the walk: {entered}"


def test_delay_enters_each_module_at_most_twice(app: Celery) -> None:
    @app.task(base=SingletonTask)
    def refresh(user_id: int, full: bool = False) -> None: ...

    job = app.tasks[refresh.name]
    job.delay(0)  # the first call reads the options and makes the client
    # A new key: bound, encoded, hashed; a new RedisLock is built, which the core
    # validates piece by piece (entering core.validate and core.keys many times):
    # the Celery glue's part is checked.
    _check(walk(lambda: job.delay(1)), "celery.")
    # Another spelling of the first call: its key worked out again, the lock kept from
    # then (every module counts, the core's too).
    _check(walk(lambda: job.delay(0, full=False)))
    _check(walk(lambda: job.delay(1)))  # the lock kept; the duplicate is refused
