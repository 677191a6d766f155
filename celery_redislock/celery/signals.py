"""Signals sent by singleton and bounded tasks, so users can count, log and alert.

They are Celery signals (:class:`celery.utils.dispatch.Signal`): connect as to
``task_prerun``, optionally for one task as ``sender``. Receivers get the arguments
below as keywords and must accept ``**kwargs``: later versions may add some. A
receiver that raises is logged and does not disturb the task.

``sender`` is always the task (its instance). Common arguments:

* ``task_id`` -- id of the task call the event is about (None when not yet known);
* ``key`` -- the lock name (see :mod:`.singleton.signature`), or the semaphore pool name;
* ``stage`` -- ``"enqueue"`` (in ``apply_async``), ``"run"`` (in the worker, around
  the body), or ``"cleanup"`` (in the worker's main process after a revoke, a time
  limit or a lost worker).

Example::

    from celery_redislock.celery.signals import singleton_duplicate

    @singleton_duplicate.connect
    def count_duplicate(sender, task_id, existing_id, action, **kwargs):
        statsd.incr(f"duplicate.{sender.name}.{action}")
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "lease_lost",
    "permit_acquired",
    "permit_duplicate",
    "permit_parked",
    "permit_released",
    "permit_rescheduled",
    "rate_admitted",
    "rate_duplicate",
    "rate_limited",
    "rate_penalized",
    "singleton_acquired",
    "singleton_duplicate",
    "singleton_released",
]

singleton_acquired = Signal(
    name="singleton_acquired",
    providing_args=("fence", "key", "stage", "task_id"),
)
"""A singleton lock was taken (``stage="enqueue"``) or taken over by the run
(``stage="run"``). ``fence`` is the lease's fencing token."""

singleton_duplicate = Signal(
    name="singleton_duplicate",
    providing_args=("action", "existing_id", "key", "stage", "task_id"),
)
"""A call found its signature's lock held by another copy, ``existing_id`` (None when
the holder is unknown). ``action`` is what was done with the new call: at enqueue
``"existing"`` (its AsyncResult returned), ``"raise"``, ``"drop"`` or ``"replace"``
(the queued copy revoked); at run time ``"skip"`` or ``"reschedule"``."""

singleton_released = Signal(
    name="singleton_released",
    providing_args=("key", "reason", "released", "stage", "task_id"),
)
"""A singleton lock was given back. ``reason`` is the task state or event that ended
it (``"SUCCESS"``, ``"FAILURE"``, ``"revoked"``, ``"worker-lost"``, ``"publish-failed"``,
...); ``released`` is False when the lease had already expired or been taken over."""

lease_lost = Signal(
    name="lease_lost",
    providing_args=("fence", "key", "kind", "task_id"),
)
"""A running task's lease (``kind="lock"`` or ``"permit"``) expired or was taken over
before the task ended: it is no longer protected. Sent from the renewal thread."""

permit_acquired = Signal(
    name="permit_acquired",
    providing_args=("fence", "key", "limit", "parked", "rescheduled", "task_id", "waited"),
)
"""A bounded task got one of the ``limit`` permits of pool ``key`` and starts.
``parked`` is True when it was a parked run handed the permit a release reserved
(False for a fresh run whose permit the worker's intake reserved as its message
arrived: granted at once, ``waited`` 0.0). ``waited`` is the seconds it waited for
the permit: since its first refusal when it was parked or re-scheduled
(``rescheduled`` re-schedules; measured on the workers' wall clocks), else the time
it waited in place (about 0.0 when granted at once)."""

permit_parked = Signal(
    name="permit_parked",
    providing_args=("key", "limit", "position", "task_id", "waited"),
)
"""All ``limit`` permits of pool ``key`` were taken: the run was parked in the pool's
FIFO queue in Redis at 1-based place ``position`` (0: a permit came free meanwhile
and it was published again at once), its message acknowledged. ``waited`` is the
seconds since its first refusal (0.0 the first time)."""

permit_duplicate = Signal(
    name="permit_duplicate",
    providing_args=("key", "task_id"),
)
"""A second message of a parked run (published twice: a sweeper re-published it
while the first copy was on its way) started after the first had taken its park
token: it was skipped and ran nothing."""

permit_rescheduled = Signal(
    name="permit_rescheduled",
    providing_args=("countdown", "key", "limit", "rescheduled", "task_id", "waited"),
)
"""All ``limit`` permits of pool ``key`` were taken: the task was sent back to the
queue to run again in ``countdown`` seconds, without counting as a retry. It is the
``rescheduled``-th time; ``waited`` seconds have passed since its first refusal."""

permit_released = Signal(
    name="permit_released",
    providing_args=("key", "reason", "released", "stage", "task_id"),
)
"""A bounded task gave its permit back; ``reason`` and ``released`` as for
:data:`singleton_released`."""

rate_limited = Signal(
    name="rate_limited",
    providing_args=("key", "position", "rate", "task_id", "waited"),
)
"""A run of a task with ``global_rate_limit`` was over the rate of limiter ``key``
(``rate``: its rate strings), or its body raised ``RateLimited``: it was parked in the
limiter's queue at 1-based place ``position`` (0: admitted again at once) and starts
at its admission time; ``waited`` is the seconds since its first refusal (0.0 the
first time)."""

rate_admitted = Signal(
    name="rate_admitted",
    providing_args=("key", "parked", "rate", "task_id", "waited"),
)
"""A run of a task with ``global_rate_limit`` was admitted by limiter ``key``
(``rate``: its rate strings) and starts. ``parked`` is True when it was a parked run
published from the limiter's queue at its admission time (its claim's admission),
False for a run admitted as it started, or whose admission was reserved as it was
sent or reached its worker (admitted at once, ``waited`` 0.0). ``waited`` is the
seconds since its first refusal when it was parked (the workers' wall clocks)."""

rate_duplicate = Signal(
    name="rate_duplicate",
    providing_args=("key", "task_id"),
)
"""A second message of a run parked for the rate of limiter ``key`` (published twice:
a claim published again by a re-sent or recovered park) started after the first had
taken its park token: it was skipped and ran nothing (as :data:`permit_duplicate`
for a pool's permit)."""

rate_penalized = Signal(
    name="rate_penalized",
    providing_args=("key", "rate", "seconds", "task_id"),
)
"""The body of a run of a task with ``global_rate_limit`` raised ``RateLimited`` (the
API answered 429): limiter ``key`` (``rate``: its rate strings) was penalized for
``seconds`` for every worker. The run is then parked again (``rate_limited``)."""
