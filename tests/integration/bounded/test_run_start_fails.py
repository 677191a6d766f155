"""A hold whose ``on_start`` raises (not a Redis error: a bug, a version skew) fails
the run, and every hold is given back by the run itself, before its result is stored
-- as for an error of the body -- not later by the ``task_postrun`` safety net."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery, signals

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.guard import PermitHold

from ..helpers import wait_until
from .helpers import holders


def test_a_hold_whose_start_raises_is_given_back_before_the_result_is_stored(
    app: Celery, locks: redis.Redis, worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``on_start`` ran before the ``try`` of ``__call__``, so its error skipped
    the finish: the permit was still held when the failure was stored and reported
    (``task_failure`` sees ``['api' held]``) -- a caller that saw the failure and sent
    again found the pool full until ``task_postrun`` gave it back."""

    def broken(self: PermitHold) -> None:
        raise RuntimeError("on_start broke")

    monkeypatch.setattr(PermitHold, "on_start", broken)
    held_at_failure: list[int] = []

    def on_failure(sender: Any = None, **_: Any) -> None:
        held_at_failure.append(len(holders(locks, "api")))

    signals.task_failure.connect(on_failure, weak=False)
    try:

        @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
        def call() -> None:  # pragma: no cover - on_start fails before it
            pass

        worker(app, concurrency=1)
        with pytest.raises(RuntimeError, match="on_start broke"):
            call.delay().get(timeout=30)
        # task_failure is sent after the failure is stored, so maybe after get()
        wait_until(lambda: held_at_failure, 10, "task_failure")
    finally:
        signals.task_failure.disconnect(on_failure)
    assert held_at_failure == [0]
    assert not holders(locks, "api")
