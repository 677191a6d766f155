"""Where the counters live in the lock Redis and what they are called (issue #27).

One hash per kind and name: ``{prefix}:metrics:{kind}:{{name}}`` -- the name between
braces is its Redis Cluster hash tag, so each hash lives on one node and an event's
increments (outcome, histogram bucket, sum) go to one key. Fields:

* ``n:<outcome>`` -- events of that outcome;
* ``w:<i>`` / ``h:<i>`` -- waits / holds that fell in bucket ``i`` of :data:`BUCKETS`
  (not cumulative: the reader sums them up, so an event writes one bucket);
* ``ws`` / ``hs`` -- the sum of the waits / holds, in microseconds (integers: HINCRBY).

``name`` is a task, pool, limiter, beat group or beat entry name -- never a lock key
or a tenant's pool: the number of hashes is bounded by the app's task and schedule
definitions, whatever the number of keys.
"""

from __future__ import annotations

import bisect
from typing import Final

from ...core.keys import decode_name, encode_name

__all__ = [
    "BUCKETS",
    "HOLD",
    "KINDS",
    "OUTCOMES",
    "WAIT",
    "bucket_of",
    "counter_key",
    "counter_match",
    "parse_counter_key",
]

KINDS: Final = ("lock", "semaphore", "parking", "ratelimit", "beat")
"""``lock``: singleton tasks' locks; ``semaphore``: bounded tasks' permits;
``parking``: refused runs parked (their start on a handed-off permit counts as
``semaphore`` ``handed_off``, with its wait); ``ratelimit``: global rate
limits (a run parked for the rate and admitted from the limiter's queue counts as
``handed_off``, with its wait); ``beat``: ``LeaderScheduler``."""

OUTCOMES: Final = (
    "granted",  # at once (a fresh run's permit reserved by its worker's intake too)
    "granted_after_wait",  # waited in place, or came back after a re-schedule
    "refused_duplicate",  # at enqueue: a copy is queued or running (on_duplicate)
    "skipped_duplicate",  # a running duplicate (or a parked run's second message) skipped
    "rescheduled_duplicate",  # a running duplicate sent back to the queue
    "rescheduled",  # no permit: sent back with a countdown
    "parked",  # no permit: parked in the pool's queue in Redis
    "handed_off",  # a parked run took the permit (or admission) reserved for it
    "released",  # given back by the run
    "lease_lost",  # expired or taken over while the run was going
    "reclaimed",  # given back by the worker's main process after the run died
    "rate_limited",  # refused by a rate limit
    "penalized",  # a limiter's penalty was set
    "elected",  # beat: this beat became leader
    "slot_sent",  # beat: a schedule slot claimed and sent
    "slot_skipped",  # beat: a slot another beat had claimed
)
"""Every outcome an event may count (the ``outcome`` label)."""

BUCKETS: Final = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
)
"""Upper bounds (seconds) of the wait and hold histograms: 1 ms to 4 h; beyond is
``+Inf`` (index ``len(BUCKETS)``)."""

WAIT: Final = "w"
"""Field stem of the wait histogram."""

HOLD: Final = "h"
"""Field stem of the hold histogram."""

_SEGMENT: Final = "metrics"


def bucket_of(seconds: float) -> int:
    """The index of the bucket ``seconds`` falls in (``len(BUCKETS)``: above the last)."""
    return bisect.bisect_left(BUCKETS, seconds)


def counter_key(prefix: str, kind: str, name: str) -> str:
    """The hash of ``kind``'s counters for ``name``."""
    return f"{prefix}:{_SEGMENT}:{kind}:{{{encode_name(name)}}}"


def counter_match(prefix: str) -> str:
    """A ``SCAN`` pattern that finds every counter hash under ``prefix``."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}:{_SEGMENT}:*:{{*}}"


def parse_counter_key(key: str, prefix: str) -> tuple[str, str] | None:
    """``(kind, name)`` of a counter hash's key, else None."""
    head = f"{prefix}:{_SEGMENT}:"
    if not key.startswith(head) or not key.endswith("}"):
        return None
    kind, sep, rest = key[len(head) : -1].partition(":{")
    if not sep or kind not in KINDS or "{" in rest or "}" in rest:
        return None
    return kind, decode_name(rest)
