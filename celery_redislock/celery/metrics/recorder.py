"""The per-process recorder: events added to the counters in the lock Redis (#27).

:func:`record` never blocks on Redis and never raises into a task: it adds the event
to this process's pending increments and wakes the recorder's thread, which sends
everything pending in one pipeline of ``HINCRBY`` (one per touched field), then lets
the next events gather for :data:`SPACING` seconds. Counting
in Redis is what makes the counts exact under prefork: every process of every worker
adds to the same hashes, and a scrape reads their sums.

While Redis does not answer, the pending increments stay (they are summed per field,
so memory is bounded by the number of names, not of events) and are sent once it
answers again; the failure is logged once per outage. A clean exit (atexit, and
Celery's ``worker_process_shutdown``) flushes.

**What a SIGKILL loses** is what the process had pending: the events it recorded
after its thread took the last batch that reached Redis. The thread takes a batch
at once when it is idle, else :data:`SPACING` after its last send; so, while Redis
answers, an event is in Redis within SPACING plus one send's round trip of being
recorded -- plus whatever time the machine keeps the thread from running -- and a
kill loses only events younger than that (tests/integration/metrics/test_kill_bound.py:
24 kills of a process counting every 0.5 ms, the oldest event lost 0.1-20.7 ms old
at load ~5 on 2 cores; the test allows SPACING + 0.1 s). While Redis does not
answer, everything pending since the outage began is lost with the process.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import Counter
from typing import Final

from redis.client import Pipeline
from redis.cluster import ClusterPipeline

from ...core.scripts import RedisClient
from .schema import HOLD, WAIT, bucket_of, counter_key

__all__ = ["SPACING", "Recorder", "flush", "record", "recorder_for"]

logger = logging.getLogger("celery_redislock.metrics")

_RETRY_AFTER: Final = 1.0
"""Seconds between attempts while Redis does not answer."""

_IDLE_CHECK: Final = 30.0
"""Seconds an idle thread waits before it looks whether its client still exists."""

SPACING: Final = 0.02
"""Seconds the thread lets events gather after a send. The first event after a quiet
spell goes at once; on a busy process a send carries ~20 ms of events, summed per
field. Sending each event at once cost a sequential singleton call 0.3-0.9 ms (the
thread's wake-ups and round trips beside the task's); with this spacing, the cost is
within the benchmark's noise (benchmarks/bench_metrics.py, README)."""

_Field = tuple[str, str]  # (key, field)


class Recorder:
    """Pending increments of one process for one client, and the thread sending them."""

    def __init__(self, client: RedisClient, spacing: float = 0.0) -> None:
        # Weak: a recorder never keeps its client (and its connections) alive; an app
        # dropped (a test's) takes its client along, and the idle thread then ends.
        self._client = weakref.ref(client)
        self._spacing = spacing
        self._flushing = 0
        self._pending: Counter[_Field] = Counter()
        self._guard = threading.Lock()
        self._wake = threading.Condition(self._guard)
        self._sending = 0  # batches taken but not yet confirmed (for flush)
        self._failing = False
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for a first event (only then woken by add)
        self._dropped_said = False  # events dropped with the client gone: said once

    def add(
        self,
        prefix: str,
        kind: str,
        name: str,
        outcome: str,
        *,
        wait: float | None = None,
        hold: float | None = None,
    ) -> None:
        """Count one event (and its wait or hold time); sent by the thread soon."""
        key = counter_key(prefix, kind, name)
        with self._guard:
            pending = self._pending
            pending[key, "n:" + outcome] += 1
            for stem, seconds in ((WAIT, wait), (HOLD, hold)):
                if seconds is not None:
                    seconds = max(0.0, seconds)
                    pending[key, f"{stem}:{bucket_of(seconds)}"] += 1
                    pending[key, f"{stem}s"] += round(seconds * 1e6)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery_redislock-metrics", daemon=True
                )
                self._thread.start()
            if self._idle:  # else it is sending or gathering: it takes this one then
                self._wake.notify()

    @property
    def failing(self) -> bool:
        """True while the last send failed (Redis did not answer)."""
        return self._failing

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything counted so far was sent (True), or ``timeout`` passed."""
        with self._guard:
            if self._thread is None:
                return not self._pending
            self._flushing += 1
            self._wake.notify_all()
            try:
                return self._wake.wait_for(
                    lambda: not self._pending and not self._sending, timeout=timeout
                )
            finally:
                self._flushing -= 1

    def _run(self) -> None:
        while True:
            with self._guard:
                self._idle = True
                self._wake.wait_for(lambda: bool(self._pending), timeout=_IDLE_CHECK)
                self._idle = False
                if not self._pending:
                    if self._client() is None:  # nothing will come: end (add starts another)
                        self._thread = None
                        return
                    continue
                batch, self._pending = self._pending, Counter()
                self._sending += 1
            sent = self._send(batch)
            with self._guard:
                self._sending -= 1
                if not sent:
                    self._pending.update(batch)  # kept for the next attempt
                self._wake.notify_all()
            with self._guard:
                if not sent:
                    self._wake.wait(_RETRY_AFTER)
                elif self._spacing:  # let the next events gather (a flush cuts it short)
                    self._wake.wait_for(lambda: self._flushing > 0, timeout=self._spacing)

    def _pipeline(self, batch: Counter[_Field]) -> Pipeline | ClusterPipeline | None:
        # The client only in this frame: a failed send's error, logged, keeps the
        # frames of its traceback (a log handler that keeps records), and the client
        # is held weakly so that it can go with its app.
        client = self._client()
        if client is None:
            return None
        pipe = client.pipeline(transaction=False)
        for (key, field), amount in batch.items():
            pipe.hincrby(key, field, amount)
        return pipe

    def _send(self, batch: Counter[_Field]) -> bool:
        try:
            pipe = self._pipeline(batch)
            if pipe is None:  # its app and client are gone: nobody reads these counts
                self._say_dropped(batch)
                return True
            pipe.execute()
        except Exception as exc:  # never let counting disturb a task; retried
            if not self._failing:
                logger.warning(
                    "celery_redislock: metrics not sent (%s); kept and retried every %.0fs",
                    exc,
                    _RETRY_AFTER,
                )
            self._failing = True
            return False
        if self._failing:
            logger.info("celery_redislock: metrics sent again")
        self._failing = False
        return True

    def _say_dropped(self, batch: Counter[_Field]) -> None:
        # Said, not silent: the counts come out short. Once at WARNING per recorder
        # (its client is gone for good; events recorded through it later, DEBUG).
        events = sum(amount for (_, field), amount in batch.items() if field.startswith("n:"))
        logger.log(
            logging.DEBUG if self._dropped_said else logging.WARNING,
            "celery_redislock: %d metrics event(s) dropped: their Redis client was closed "
            "or dropped (its app gone) before they were sent",
            events,
        )
        self._dropped_said = True


# Per process (a recorder's thread does not survive a fork) and per client object.
_recorders: weakref.WeakKeyDictionary[RedisClient, tuple[int, Recorder]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def recorder_for(client: RedisClient) -> Recorder:
    """This process's recorder for ``client``."""
    pid = os.getpid()
    found = _recorders.get(client)
    if found is not None and found[0] == pid:
        return found[1]
    with _lock:
        found = _recorders.get(client)
        if found is None or found[0] != pid:
            found = (pid, Recorder(client, SPACING))
            _recorders[client] = found
    return found[1]


def record(
    client: RedisClient,
    prefix: str,
    kind: str,
    name: str,
    outcome: str,
    *,
    wait: float | None = None,
    hold: float | None = None,
) -> None:
    """Count one event of ``kind`` for ``name`` in ``client``'s Redis under ``prefix``.

    The seam for events without a signal: call it where the event happens. Never
    raises for Redis trouble and never waits for it. Pass a client you keep (the app's,
    ``celery_redislock.celery.client.get_redis(app)``): the recorder holds it weakly,
    and what a client collected before its thread sent it is dropped (one WARNING
    with the count).
    """
    recorder_for(client).add(prefix, kind, name, outcome, wait=wait, hold=hold)


def flush(timeout: float = 5.0) -> bool:
    """Send everything this process counted so far; False if Redis did not take it in
    ``timeout`` seconds (it stays pending). One deadline for all of this process's
    recorders: an exit waits ``timeout`` at most, however many Redis servers are down."""
    pid = os.getpid()
    deadline = time.monotonic() + timeout
    mine = [recorder for owner, recorder in list(_recorders.values()) if owner == pid]
    ok = True
    # Those whose Redis answered last first: one whose Redis is down takes what is left.
    for recorder in sorted(mine, key=lambda recorder: recorder.failing):
        ok = recorder.flush(max(0.0, deadline - time.monotonic())) and ok
    return ok


atexit.register(flush, 2.0)
