"""The signals exist, are Celery signals, and reach receivers filtered by sender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.utils.dispatch import Signal

from celery_redislock.celery import signals

NAMES = [
    "singleton_acquired",
    "singleton_duplicate",
    "singleton_released",
    "lease_lost",
    "permit_acquired",
    "permit_parked",
    "permit_duplicate",
    "permit_rescheduled",
    "permit_released",
    "rate_limited",
    "rate_admitted",
    "rate_duplicate",
    "rate_penalized",
]


def test_all_signals_are_exported_and_documented() -> None:
    assert sorted(signals.__all__) == sorted(NAMES)
    source = Path(signals.__file__).read_text(encoding="utf-8")
    for name in NAMES:
        signal = getattr(signals, name)
        assert isinstance(signal, Signal)
        assert signal.name == name  # type: ignore[attr-defined]
        # Each signal is followed by a docstring naming what it provides.
        after = source.split(f"{name} = Signal(", 1)[1]
        assert '"""' in after.split(" = Signal(", 1)[0], name
        assert {"task_id", "key"} <= signal.providing_args  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", NAMES)
def test_receivers_get_keywords_and_can_filter_by_task(name: str) -> None:
    app = Celery("signals", set_as_current=False)

    @app.task(shared=False)
    def one_() -> None: ...

    @app.task(shared=False)
    def other_() -> None: ...

    # Senders are task instances (the task's self), not the decorator's lazy proxies.
    one, other = app.tasks[one_.name], app.tasks[other_.name]

    signal: Signal = getattr(signals, name)
    got: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append({"sender": sender, **kwargs})

    signal.connect(receiver, sender=one, weak=False)
    try:
        signal.send(sender=other, task_id="b", key="k")
        signal.send(sender=one, task_id="a", key="k")
    finally:
        signal.disconnect(receiver, sender=one)
    assert [(g["sender"], g["task_id"], g["key"], g["signal"]) for g in got] == [
        (one, "a", "k", signal)
    ]
