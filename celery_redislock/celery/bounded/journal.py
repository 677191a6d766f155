"""The park journal of an app: parked runs kept in the broker's Redis as well.

A parked run's message lives in the lock Redis only (its broker message was
acknowledged). When the broker is a Redis *other than* the lock Redis, every parked run
is also written to a :class:`~celery_redislock.core.journal.ParkJournal` there (one
script call when it parks, :func:`record`) and dropped from it when its run starts,
before the park token is consumed (one script call, :func:`forget`); if the lock Redis
comes back without its data, the sweepers park every journaled run again
(:mod:`.recovery`). When the broker and the lock Redis are one server, a restart
without data loses the broker's queues as well, as with plain Celery: no journal.

``redislock_park_journal_url``: None (default) -- the broker's Redis (or Sentinel)
when it is not the lock Redis's server, else none; a ``redis://``/``sentinel://`` URL
-- that Redis; ``False`` -- no journal. With a RabbitMQ broker there is no journal
unless this names a Redis of its own (parked runs then survive a lock Redis restart
only with its own persistence, ``appendonly yes``).

May import the core and the shared glue (client, config, sentinel).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import redis
from celery import Celery

from ...core.journal import ParkJournal
from ...core.keys import DEFAULT_PREFIX
from ...core.parking import ParkingQueue
from ...errors import ConfigurationError
from ..client import connection_source, transport_options
from ..config import CLIENT_KEYS
from ..outage import OUTAGE_ERRORS
from ..sentinel import is_sentinel_url, sentinel_client
from ..upstream import conf_fingerprint
from .settings import park_keep

__all__ = [
    "JOURNAL_URL",
    "ParkSpec",
    "forget",
    "forget_if_taken",
    "journal_for",
    "read_value",
    "record",
]

JOURNAL_URL: Final = "redislock_park_journal_url"
_KEYS: Final = (JOURNAL_URL, "redislock_prefix", "redislock_park_keep", *CLIENT_KEYS)

logger = logging.getLogger(__name__)

_PENDING_MAX: Final = 10_000
_pending: dict[str, list[str]] = {}  # journal key -> drops its Redis missed: sent first
_pending_guard = threading.Lock()

# app -> (pid, conf fingerprint, journal or None, keep seconds)
_journals: weakref.WeakKeyDictionary[Celery, tuple[int, Hashable, ParkJournal | None, float]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class ParkSpec:
    """Which queue a parked run waits in, enough to find it again from any process
    (a sweeper, :mod:`.recovery`): the capacity's ``kind`` (see
    :class:`~celery_redislock.core.parking.Capacity`), the ``pool``'s name, the key
    ``prefix`` and the kind's own ``terms`` (a semaphore's ``(limit, ttl)``, a rate
    limiter's rates; stored as JSON)."""

    kind: str
    pool: str
    prefix: str
    terms: tuple[str | float, ...]


def journal_for(app: Celery) -> ParkJournal | None:
    """The app's park journal, or None (see the module); made once per process."""
    return _state(app)[0]


def _state(app: Celery) -> tuple[ParkJournal | None, float]:
    pid, fingerprint = os.getpid(), conf_fingerprint(app, _KEYS)
    cached = _journals.get(app)
    if cached is not None and fingerprint is not None and cached[:2] == (pid, fingerprint):
        return cached[2], cached[3]
    journal = _make(app)
    keep = park_keep(app)
    if fingerprint is not None:
        _journals[app] = (pid, fingerprint, journal, keep)
    return journal, keep


def record(
    app: Celery,
    entry_id: str,
    payload: bytes,
    *,
    spec: ParkSpec,
    owner: str,
) -> None:
    """Journal a run about to be parked (before the lock Redis has it). With the
    journal's Redis unreachable the run parks without it (WARNING): waiting for it
    would hold the run, and fail it after ``redislock_outage_attempts``."""
    journal, keep = _state(app)
    if journal is not None:
        head = json.dumps(
            {
                "kind": spec.kind,
                "pool": spec.pool,
                "prefix": spec.prefix,
                "terms": list(spec.terms),
                "owner": owner,
            },
            separators=(",", ":"),
        )
        try:
            _flush(journal)
            journal.put(entry_id, head.encode() + b"\n" + payload, keep)
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "celery_redislock: the park journal's Redis is unreachable "
                "(%s); run %s parks without it (lost if the lock Redis loses "
                "its data before it runs)",
                exc,
                owner,
            )


def forget(app: Celery, entry_id: str) -> None:
    """Drop a parked run from the journal: its run starts (or it is dead). With the
    journal's Redis unreachable the drop is kept and sent before the next one."""
    journal = journal_for(app)
    if journal is not None:
        try:
            _flush(journal)
            journal.drop(entry_id)
        except OUTAGE_ERRORS as exc:
            with _pending_guard:
                missed = _pending.setdefault(journal.entries_key, [])
                if len(missed) < _PENDING_MAX:
                    missed.append(entry_id)
            logger.warning(
                "celery_redislock: the park journal's Redis is unreachable (%s); "
                "parked run %s is dropped from it later",
                exc,
                entry_id,
            )


def _flush(journal: ParkJournal) -> None:
    missed = _pending.get(journal.entries_key)
    while missed:
        with _pending_guard:
            entry_id = missed[0] if missed else None
        if entry_id is None:
            return
        journal.drop(entry_id)
        with _pending_guard:
            if missed and missed[0] == entry_id:
                missed.pop(0)


def read_value(value: bytes) -> tuple[ParkSpec, str, bytes]:
    """``(spec, owner, payload)`` of a journaled run; ValueError for anything else.
    A head written before parking took other kinds of capacity,
    ``[pool, limit, ttl, prefix, owner]``, reads as a semaphore's."""
    head, sep, payload = value.partition(b"\n")
    try:
        fields = json.loads(head)
        if isinstance(fields, list):  # the semaphores' format of before
            pool, limit, ttl, prefix, owner = fields
            if int(limit) < 1 or float(ttl) <= 0:
                raise ValueError("a semaphore's limit >= 1 and ttl > 0")
            fields = {
                "kind": "semaphore",
                "pool": pool,
                "prefix": prefix,
                "terms": [int(limit), float(ttl)],
                "owner": owner,
            }
        spec = ParkSpec(fields["kind"], fields["pool"], fields["prefix"], tuple(fields["terms"]))
        owner = fields["owner"]
        if sep and all(isinstance(x, str) for x in (spec.kind, spec.pool, spec.prefix, owner)):
            return spec, owner, payload
    except (TypeError, ValueError, KeyError, AttributeError):
        pass
    raise ValueError(f"not a journaled parked run (header {head[:60]!r})")


def _make(app: Celery) -> ParkJournal | None:
    setting = app.conf.get(JOURNAL_URL)
    prefix = app.conf.get("redislock_prefix") or DEFAULT_PREFIX
    options = dict(app.conf.get("redislock_client_options") or {})
    if setting is False or setting == "":
        return None
    if setting is not None:
        if not isinstance(setting, str) or _scheme(setting) not in _SCHEMES:
            raise ConfigurationError(
                f"{JOURNAL_URL} must be a redis://, rediss://, unix:// "
                f"or sentinel:// URL, or False, got {setting!r}"
            )
        transport = "redislock_transport_options"
        return ParkJournal(_client(app, setting, transport, options), prefix)
    broker = _broker_url(app.conf.broker_write_url)
    if broker is None or _scheme(broker) not in _SCHEMES:
        return None  # e.g. RabbitMQ: no Redis survives the lock Redis but the lock Redis
    transport = "broker_transport_options"
    locks_url, locks_setting = connection_source(app)
    if _server(app, broker, transport) == _server(app, locks_url, locks_setting):
        return None  # one server: a restart without data loses the broker queue too
    if broker.startswith("rediss:") and isinstance(app.conf.get("broker_use_ssl"), dict):
        options = {**app.conf.broker_use_ssl, **options}
    return ParkJournal(_client(app, broker, transport, options), prefix)


def _broker_url(value: object) -> str | None:
    if isinstance(value, (list, tuple)):
        value = ";".join(url for url in value if isinstance(url, str))
    if not isinstance(value, str) or not value:
        return None
    # A failover list: the first is the primary (a Sentinel URL lists the Sentinels).
    return value if is_sentinel_url(value) else value.split(";")[0].strip()


_SCHEMES: Final = frozenset({"redis", "rediss", "unix", "redis+socket", "sentinel"})


def _scheme(url: str) -> str:
    return urlsplit(url.split(";")[0].strip()).scheme


def _client(app: Celery, url: str, setting: str, options: dict[str, Any]) -> redis.Redis:
    if is_sentinel_url(url):
        return sentinel_client(url, transport_options(app, setting), options, setting)
    if _scheme(url) == "redis+socket":
        parts = urlsplit(url)
        url = f"unix://{parts.netloc}{parts.path}"
    return redis.Redis.from_url(url, **options)


def _server(app: Celery, url: str, setting: str) -> Hashable:
    """Which server ``url`` reaches (its database aside): host and port, a socket's
    path, or a Sentinel group's master name and Sentinels."""
    if is_sentinel_url(url):
        name = transport_options(app, setting).get("master_name")
        hosts = frozenset(
            (urlsplit(p.strip()).hostname, urlsplit(p.strip()).port)
            for p in url.split(";")
            if p.strip()
        )
        return "sentinel", name, hosts
    parts = urlsplit(url.split(";")[0].strip())
    if parts.scheme in ("unix", "redis+socket"):
        return "unix", os.path.realpath(parts.path)
    host = parts.hostname or "localhost"
    return "tcp", "127.0.0.1" if host == "localhost" else host, parts.port or 6379


def forget_if_taken(app: Celery, queue: ParkingQueue, entry_id: str) -> bool:
    """After a park that answered place 0: True when the run of ``entry_id`` took its
    token already -- the message was a copy (a redelivery) and the park changed nothing
    -- and its journal record, written before the park, is dropped (a lock Redis that
    lost its data would park that run again). False otherwise (claimed at once and
    published: the record stays for its run), or when the lock Redis did not answer."""
    try:
        if queue.capacity.client.zscore(queue.taken_key, entry_id) is None:
            return False
    except Exception as exc:
        logger.debug(
            "celery_redislock: park token %s not looked up (%s: %s)",
            entry_id,
            type(exc).__name__,
            exc,
        )
        return False
    forget(app, entry_id)
    return True
