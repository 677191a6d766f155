"""The renewer's network side: one thread per Redis client sends the batched renewals.

The scheduler (:mod:`.scheduler`) submits ``(entry, ttl_ms)`` pairs; the sender
groups whatever is pending by script and hash slot (one group on a standalone
server; in Redis Cluster all keys of one script call must share a slot), and sends
each group as one call of at most :data:`MAX_BATCH` leases. A call may block for as
long as Redis does not answer (and redis-py retries); only this thread waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from ..scripts import LuaScript
from .entry import Entry, Reply

__all__ = ["MAX_BATCH", "Sender", "batch_call", "batch_replies", "check_batch_reply",
           "failure", "splits"]

log = logging.getLogger(__name__)

MAX_BATCH = 10_000
"""Most leases renewed by one script call (a larger batch is split)."""

IDLE_EXIT = 10.0
"""Seconds a sender thread lingers with nothing to send before it exits."""


class Sender:
    """Sends the renewals of one Redis client from its own thread."""

    def __init__(
        self,
        client: Any,
        lock: threading.Lock,
        on_replies: Callable[[list[Reply], float, str], None],
        on_exit: Callable[[Sender], None],
    ) -> None:
        self.client = client
        self._cond = threading.Condition(lock)
        self._on_replies = on_replies
        self._on_exit = on_exit
        self._pending: dict[tuple[LuaScript, int], list[tuple[Entry, int]]] = {}
        self._thread: threading.Thread | None = None

    def submit(self, entry: Entry, ttl_ms: int) -> None:
        """Queue one renewal; call with the renewer's lock held."""
        self._pending.setdefault((entry.script, entry.slot), []).append((entry, ttl_ms))
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="celery-redislock-renewal-sender", daemon=True
            )
            self._thread.start()
        self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(IDLE_EXIT) and not self._pending:
                        self._thread = None
                        self._on_exit(self)
                        return
                work, self._pending = self._pending, {}
            for (script, _slot), items in work.items():
                for start in range(0, len(items), MAX_BATCH):
                    self._send(script, items[start : start + MAX_BATCH])

    def _send(self, script: LuaScript, items: list[tuple[Entry, int]]) -> None:
        keys, args = batch_call(items)
        sent_at = time.monotonic()
        error = ""
        renewed: list[Any] = []
        try:
            renewed = check_batch_reply(script, items, script(self.client, keys, args))
        except Exception as exc:  # every failure is retried until the lease's deadline
            if splits(exc, items):
                self._send(script, items[: len(items) // 2])
                self._send(script, items[len(items) // 2 :])
                return
            error = failure(exc, items)
        self._on_replies(batch_replies(items, renewed, error), sent_at, error)


# -- what the sync sender and the async renewer share (no I/O) ------------------------


def batch_call(items: list[tuple[Entry, int]]) -> tuple[list[Any], list[Any]]:
    """KEYS and ARGV of one batch renewal call (see ``entry.Renewable``)."""
    keys = [key for entry, _ in items for key in entry.keys]
    args: list[Any] = [entry.token for entry, _ in items]
    args += [ttl_ms for _, ttl_ms in items]
    return keys, args


def check_batch_reply(script: LuaScript, items: list[tuple[Entry, int]], reply: Any) -> list[Any]:
    """The batch call's reply as a list of one answer per lease, else ValueError."""
    renewed = list(reply)
    if len(renewed) != len(items):
        raise ValueError(f"{script.name} answered {len(renewed)} of {len(items)}")
    return renewed


def splits(exc: Exception, items: list[tuple[Entry, int]]) -> bool:
    """True when a failed batch should be sent again as two halves: a script error
    (e.g. WRONGTYPE: a key overwritten by someone else) fails the whole call, and
    halving confines it to the bad lease."""
    return isinstance(exc, ResponseError) and len(items) > 1


def failure(exc: Exception, items: list[tuple[Entry, int]]) -> str:
    """The error text recorded for a failed call (retried until each lease's deadline)."""
    error = f"{type(exc).__name__}: {exc}"
    log.debug("celery_redislock: renewal of %d leases failed: %s", len(items), error)
    return error


def batch_replies(items: list[tuple[Entry, int]], renewed: list[Any], error: str) -> list[Reply]:
    """Each lease's outcome of one call, for :meth:`.schedule.Schedule.answered`."""
    return [
        (entry, ttl_ms, not error and int(renewed[i]) == 1)
        for i, (entry, ttl_ms) in enumerate(items)
    ]
