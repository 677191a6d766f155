"""The renewer's network side: one thread per Redis client sends the batched renewals.

The scheduler (:mod:`.scheduler`) submits ``(entry, ttl_ms)`` pairs; the sender
groups whatever is pending by script and hash slot (one group on a standalone
server; in Redis Cluster all keys of one script call must share a slot), and sends
each group as one call of at most :data:`MAX_BATCH` leases. A call may block for as
long as Redis does not answer (and redis-py retries); only this thread waits.

Renewal has its own path: on a plain ``redis.Redis`` the sender opens a connection of
its own (a one-connection pool with the client's settings) as soon as the first lease
to renew is granted, and loads the renewal scripts on it, in the background; once
ready, every renewal goes through it, kept open, never waiting behind the caller's
commands nor paying a new connection's handshake (HELLO, CLIENT SETINFO, ...). Until
then renewals use the client's pool, and each script's first call is sent with its
text (EVAL), never EVALSHA -> NOSCRIPT -> EVAL: one round trip per renewal from the
first one on, so a lease survives while a round trip takes at most a fifth of its
TTL (it is renewed a third into its TTL).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.typing import EncodableT, KeyT

try:  # redis-py >= 7: maintenance notifications (one more handshake round trip)
    from redis.maint_notifications import MaintNotificationsConfig

    _NO_MAINT: MaintNotificationsConfig | None = MaintNotificationsConfig(enabled=False)
except ImportError:  # pragma: no cover - older redis-py
    _NO_MAINT = None

from ..scripts import LuaScript
from .entry import Entry, RenewalClient, Reply, restart_grace_ms

__all__ = [
    "MAX_BATCH",
    "Sender",
    "batch_call",
    "batch_replies",
    "check_batch_reply",
    "failure",
    "splits",
]

log = logging.getLogger(__name__)

MAX_BATCH = 10_000
"""Most leases renewed by one script call (a larger batch is split)."""

IDLE_EXIT = 10.0
"""Seconds a sender thread lingers with nothing to send before it exits."""


class Sender:
    """Sends the renewals of one Redis client from its own thread."""

    def __init__(
        self,
        client: RenewalClient,
        lock: threading.Lock,
        on_replies: Callable[[list[Reply], float, str], None],
        on_exit: Callable[[Sender], None],
    ) -> None:
        self.client = client
        self._own: redis.Redis | None = None  # the renewer's own client (see warm)
        self._loaded: set[LuaScript] = set()  # sent with their text once already
        self._cond = threading.Condition(lock)
        self._on_replies = on_replies
        self._on_exit = on_exit
        self._pending: dict[tuple[LuaScript, int], list[tuple[Entry, int]]] = {}
        self._thread: threading.Thread | None = None

    def warm(self) -> None:
        """Start the sender thread now (call with the renewer's lock held): it opens
        the renewer's own connection while the first renewal is not due yet."""
        self._start()

    def _open(self) -> None:
        """The renewer's own connection: a one-connection pool with the client's
        settings but a light handshake (no CLIENT SETINFO, no maintenance
        notifications: round trips a renewal cannot afford), opened now. The scripts
        load with their first call (sent with their text: no NOSCRIPT round trip).
        On any failure the client's pool serves instead."""
        client = self.client
        if not isinstance(client, redis.Redis) or client.connection is not None:
            return  # a cluster or single-connection client: renewals go through it
        pool = client.connection_pool
        try:
            kwargs = dict(pool.connection_kwargs)
            kwargs.pop("max_connections", None)
            if "driver_info" in kwargs:
                kwargs["driver_info"] = None
            if "maint_notifications_config" in kwargs and _NO_MAINT is not None:
                kwargs["maint_notifications_config"] = _NO_MAINT
            own = redis.Redis(
                connection_pool=redis.ConnectionPool(
                    connection_class=pool.connection_class, max_connections=1, **kwargs
                )
            )
            own.connection_pool.release(own.connection_pool.get_connection())  # connects
        except Exception as exc:  # the client's pool serves; tried again next start
            log.debug("celery_redislock: renewal connection failed: %r", exc)
            return
        self._own = own

    def close(self) -> None:
        """Close the renewer's own connection (the sender is done)."""
        own, self._own = self._own, None
        self._loaded.clear()
        if own is not None:
            own.close()
            own.connection_pool.disconnect()

    def submit(self, entry: Entry, ttl_ms: int) -> None:
        """Queue one renewal; call with the renewer's lock held."""
        self._pending.setdefault((entry.script, entry.slot), []).append((entry, ttl_ms))
        self._start()
        self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="celery-redislock-renewal-sender", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        if self._own is None:
            self._open()
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(IDLE_EXIT) and not self._pending:
                        self._thread = None
                        self._on_exit(self)
                        self.close()
                        return
                work, self._pending = self._pending, {}
            for (script, _slot), items in work.items():
                for start in range(0, len(items), MAX_BATCH):
                    self._send(script, items[start : start + MAX_BATCH])

    def _send(self, script: LuaScript, items: list[tuple[Entry, int]]) -> None:
        keys, args = batch_call(items)
        sent_at = time.monotonic()
        error = ""
        renewed: list[object] = []
        client = self._own or self.client
        first = script not in self._loaded  # its text at once: no NOSCRIPT round trip
        try:
            if not isinstance(client, (redis.Redis, RedisCluster)):
                raise TypeError(f"a plain renewal sender got {client!r}")  # see make()
            reply = script(client, keys, args, with_text=first)
            self._loaded.add(script)
            renewed = check_batch_reply(script, items, reply)
        except Exception as exc:  # every failure is retried until the lease's deadline
            if splits(exc, items):
                self._send(script, items[: len(items) // 2])
                self._send(script, items[len(items) // 2 :])
                return
            error = failure(exc, items)
        self._on_replies(batch_replies(items, renewed, error), sent_at, error)


# -- what the sync sender and the async renewer share (no I/O) ------------------------


def batch_call(items: list[tuple[Entry, int]]) -> tuple[list[KeyT], list[EncodableT]]:
    """KEYS and ARGV of one batch renewal call (see ``entry.Renewable``)."""
    keys: list[KeyT] = [key for entry, _ in items for key in entry.keys]
    args: list[EncodableT] = [entry.token for entry, _ in items]
    args += [ttl_ms for _, ttl_ms in items]
    graces = [restart_grace_ms(entry.holder) for entry, _ in items]
    if any(entry.gen for entry, _ in items) or any(graces):  # an explicit change: the order
        args += [entry.gen for entry, _ in items]
    if any(graces):  # leases to put back if Redis lost them (see core/restart.py)
        leases = [entry.lease() for entry, _ in items]
        args += [
            lease.fence if lease is not None and grace else 0
            for lease, grace in zip(leases, graces, strict=True)
        ]
        args += [(lease.owner or "") if lease is not None else "" for lease in leases]
        args += graces
        # Its limit: a put-back fills the placeholders first (none may be yet), so no
        # more leases than the limit are put back (see reregister_permit).
        args += [getattr(entry.holder, "_limit", 0) for entry, _ in items]
    return keys, args


def check_batch_reply(
    script: LuaScript, items: list[tuple[Entry, int]], reply: object
) -> list[object]:
    """The batch call's reply as a list of one answer per lease, else ValueError."""
    if not isinstance(reply, list):
        raise ValueError(f"{script.name} answered {reply!r:.200}, not a list")
    renewed: list[object] = reply
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


def batch_replies(items: list[tuple[Entry, int]], renewed: list[object], error: str) -> list[Reply]:
    """Each lease's outcome of one call, for :meth:`.schedule.Schedule.answered`."""
    if not error and 3 in renewed:
        log.warning(
            "celery_redislock: Redis lost its data; %d lease(s) put back by their "
            "renewal (restart grace)",
            renewed.count(3),
        )
    return [
        (
            entry,
            ttl_ms,
            None
            if not error and renewed[i] == 2  # superseded
            else not error and renewed[i] in (1, 3),
        )
        for i, (entry, ttl_ms) in enumerate(items)
    ]
