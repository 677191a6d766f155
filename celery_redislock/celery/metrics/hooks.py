"""The signal receivers that count the package's events (#27).

Connected once, when :mod:`celery_redislock.celery` is imported; each receiver counts
unless the sender's app has ``redislock_metrics = False`` (on by default: what it
costs a call is within the benchmarks' noise -- see :data:`SETTING`). Every event is
counted under the task's name (singleton locks: never the lock key), the pool's or
limiter's name (only when ``concurrency_key`` / ``global_rate_key`` names one: a
callable's may be one per tenant, so its runs are counted under the task's name) or
the beat group / entry. A rate-limited run's admission counts as a permit's does:
``granted``, or ``handed_off`` (with its wait) for a parked run published from the
limiter's queue at its admission time.
Hold times are measured in the process that took the lease, on its monotonic clock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final

from celery import Celery
from celery.signals import worker_process_shutdown

from ...core.validate import check_bool
from ..config import CLIENT_KEYS, check_prefix
from ..execution import AnyTask
from ..signals import (
    lease_lost,
    permit_acquired,
    permit_duplicate,
    permit_parked,
    permit_released,
    permit_rescheduled,
    rate_admitted,
    rate_duplicate,
    rate_limited,
    rate_penalized,
    singleton_acquired,
    singleton_duplicate,
    singleton_released,
)
from ..upstream import conf_fingerprint
from .recorder import Recorder, flush, recorder_for

__all__ = ["SETTING", "connect"]

logger = logging.getLogger("celery_redislock.metrics")

SETTING: Final = "redislock_metrics"
"""The setting that switches counting off (default True). On by default since the
receivers read the app's settings once per change, not per event (#27): a singleton
call's three signals cost ~10 us more with counting on than off (~45-50 us before),
and benchmarks/bench_metrics.py finds on and off within its noise (docs/operations/
metrics.md has the numbers)."""

_KEYS: Final = (SETTING, "redislock_prefix", *CLIENT_KEYS)
"""The settings a sink is made of (a change of any makes it again)."""

_CRASHES: Final = frozenset(("worker-lost", "time-limit"))
"""Cleanup reasons that mean the run died: its lease given back is ``reclaimed``
(a revoked run's is ``released``)."""

_WAITED_AT_ONCE: Final = 0.001
"""Seconds: a permit granted within this was granted at once, not after a wait."""

# (kind, task id) -> monotonic time the run took its lease, for the hold histogram.
_taken: dict[tuple[str, str], float] = {}
_taken_guard = threading.Lock()
_connected = False


@dataclass(frozen=True)
class _Sink:
    """Where an app's events go: this process's recorder for its lock Redis, under its
    prefix."""

    recorder: Recorder
    prefix: str


# app -> (pid, settings fingerprint, its sink or None: not counting). Read for every
# signal: reading the settings and the client each time cost ~15 us an event.
_sinks: weakref.WeakKeyDictionary[Celery, tuple[int, Hashable, _Sink | None]] = (
    weakref.WeakKeyDictionary()
)


def _sink_of(sender: Any) -> _Sink | None:
    """The sink of the sender's app, None when the app does not count."""
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery):
        return None
    pid, fingerprint = os.getpid(), conf_fingerprint(app, _KEYS)
    cached = _sinks.get(app)
    if cached is not None and cached[0] == pid and cached[1] == fingerprint:
        return cached[2]
    from ..client import get_redis

    sink = None
    try:
        if check_bool(app.conf.get(SETTING, True), SETTING):
            prefix = check_prefix(app.conf.get("redislock_prefix", "redislock"), "redislock_prefix")
            sink = _Sink(recorder_for(get_redis(app)), prefix)
    except Exception as exc:  # counting never disturbs a task; logged once per settings
        logger.error("celery_redislock: events are not counted: %s", exc)
    if fingerprint is not None:  # None: the configuration is not loaded yet
        _sinks[app] = (pid, fingerprint, sink)
    return sink


def _count(
    sink: _Sink,
    kind: str,
    name: str,
    outcome: str,
    *,
    wait: float | None = None,
    hold: float | None = None,
) -> None:
    try:
        sink.recorder.add(sink.prefix, kind, name, outcome, wait=wait, hold=hold)
    except Exception:  # counting never disturbs a task
        logger.exception("celery_redislock: could not count a %s %s event", kind, outcome)


def _pool_label(task: AnyTask, pool: str) -> str:
    from ..options import options_of

    key = options_of(task).bounded.key
    return pool if isinstance(key, str) else str(task.name)


def _taken_now(kind: str, task_id: str | None) -> None:
    if task_id is not None:
        with _taken_guard:
            _taken[kind, task_id] = time.monotonic()


def _held_for(kind: str, task_id: str | None) -> float | None:
    if task_id is None:
        return None
    with _taken_guard:
        since = _taken.pop((kind, task_id), None)
    return None if since is None else time.monotonic() - since


def _on_singleton_acquired(sender: Any = None, stage: str = "", **kw: Any) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    if stage == "run":  # the run adopted the queued lease (or took it): hold starts
        _taken_now("lock", kw.get("task_id"))
        from ..options import options_of

        if options_of(sender).singleton.lock_at_enqueue:
            return  # the lease granted at enqueue, taken over: counted then
    _count(sink, "lock", sender.name, "granted")


def _on_singleton_duplicate(
    sender: Any = None, stage: str = "", action: str = "", **kw: Any
) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    if stage == "enqueue":
        outcome = "refused_duplicate"
    elif action == "reschedule":
        outcome = "rescheduled_duplicate"
    else:
        outcome = "skipped_duplicate"
    _count(sink, "lock", sender.name, outcome)


def _on_singleton_released(sender: Any = None, stage: str = "", **kw: Any) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    if stage == "cleanup" and kw.get("reason") in _CRASHES:
        _count(sink, "lock", sender.name, "reclaimed")
        return
    hold = _held_for("lock", kw.get("task_id")) if stage == "run" else None
    _count(sink, "lock", sender.name, "released", hold=hold)


def _on_lease_lost(sender: Any = None, kind: str = "", key: str = "", **kw: Any) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    if kind == "permit":
        _count(sink, "semaphore", _pool_label(sender, key), "lease_lost")
    else:
        _count(sink, "lock", sender.name, "lease_lost")


def _on_permit_acquired(
    sender: Any = None, key: str = "", waited: float = 0.0, rescheduled: int = 0, **kw: Any
) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    name = _pool_label(sender, key)
    _taken_now("semaphore", kw.get("task_id"))
    if kw.get("parked"):  # a parked run: the permit a release reserved for it
        outcome = "handed_off"
    elif waited < _WAITED_AT_ONCE and not rescheduled:
        outcome = "granted"
    else:
        outcome = "granted_after_wait"
    _count(sink, "semaphore", name, outcome, wait=waited)


def _on_permit_parked(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "parking", _pool_label(sender, key), "parked")


def _on_permit_duplicate(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "parking", _pool_label(sender, key), "skipped_duplicate")


def _on_permit_rescheduled(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "semaphore", _pool_label(sender, key), "rescheduled")


def _on_permit_released(sender: Any = None, key: str = "", stage: str = "", **kw: Any) -> None:
    sink = _sink_of(sender)
    if sink is None:
        return
    name = _pool_label(sender, key)
    if stage == "cleanup" and kw.get("reason") in _CRASHES:
        _count(sink, "semaphore", name, "reclaimed")
        return
    hold = _held_for("semaphore", kw.get("task_id")) if stage == "run" else None
    _count(sink, "semaphore", name, "released", hold=hold)


def _limiter_label(task: AnyTask, limiter: str) -> str:
    from ..ratelimit.options import rate_options

    # A callable global_rate_key may name a limiter per tenant: counted under the task.
    return limiter if isinstance(rate_options(task).key, str) else str(task.name)


def _on_rate_limited(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "ratelimit", _limiter_label(sender, key), "rate_limited")


def _on_rate_admitted(
    sender: Any = None, key: str = "", parked: bool = False, waited: float = 0.0, **kw: Any
) -> None:
    if (sink := _sink_of(sender)) is not None:
        # As a permit's (_on_permit_acquired): a parked run's admission, claimed for it
        # by the limiter's queue, is a hand-off, with its wait; any other is at once.
        outcome = "handed_off" if parked else "granted"
        _count(sink, "ratelimit", _limiter_label(sender, key), outcome, wait=waited)


def _on_rate_penalized(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "ratelimit", _limiter_label(sender, key), "penalized")


def _on_rate_duplicate(sender: Any = None, key: str = "", **kw: Any) -> None:
    if (sink := _sink_of(sender)) is not None:
        _count(sink, "ratelimit", _limiter_label(sender, key), "skipped_duplicate")


def _beat(outcome: str, label: str) -> Callable[..., None]:
    def receiver(sender: Any = None, **kw: Any) -> None:
        if (sink := _sink_of(sender)) is not None:
            _count(sink, "beat", str(kw.get(label)), outcome)

    return receiver


def _on_process_shutdown(**kw: Any) -> None:
    flush(2.0)


def connect() -> None:
    """Connect the receivers (once per process; later calls do nothing)."""
    global _connected
    if _connected:
        return
    _connected = True
    receivers = (
        (singleton_acquired, _on_singleton_acquired),
        (singleton_duplicate, _on_singleton_duplicate),
        (singleton_released, _on_singleton_released),
        (lease_lost, _on_lease_lost),
        (permit_acquired, _on_permit_acquired),
        (permit_parked, _on_permit_parked),
        (permit_duplicate, _on_permit_duplicate),
        (permit_rescheduled, _on_permit_rescheduled),
        (permit_released, _on_permit_released),
        (rate_limited, _on_rate_limited),
        (rate_admitted, _on_rate_admitted),
        (rate_duplicate, _on_rate_duplicate),
        (rate_penalized, _on_rate_penalized),
        (worker_process_shutdown, _on_process_shutdown),
    )
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    from ..beat.signals import beat_elected, beat_lease_lost, beat_slot_sent, beat_slot_skipped

    beat_elected.connect(_beat("elected", "group"), weak=False)
    beat_lease_lost.connect(_beat("lease_lost", "group"), weak=False)
    beat_slot_sent.connect(_beat("slot_sent", "entry"), weak=False)
    beat_slot_skipped.connect(_beat("slot_skipped", "entry"), weak=False)
