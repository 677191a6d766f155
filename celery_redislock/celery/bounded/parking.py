"""Parking a run refused capacity (a bounded run's permit, the default), and
publishing it again.

A refused run is **parked**: its whole message -- task name, id, arguments, options
and headers, the ``retries`` count unchanged -- is serialized as the broker would
carry it (kombu, with the task's serializer) and queued in the lock Redis next to the
capacity it waits for (a :class:`~celery_redislock.core.parking.ParkingQueue`: for a
bounded task the pool's semaphore,
:class:`~celery_redislock.core.parking.ParkingSemaphore`); the current message is
acknowledged (the run ends with ``Ignore``). Whatever frees capacity (the release of a
permit) claims the oldest parked run in the same script, reserving the capacity for
it, and that process publishes it at once (:func:`publish_claimed`). Its message
carries :data:`PARK_HEADER`; when it starts, the guard takes the park token (once: a
second message of the same entry is skipped) and the reserved capacity.

Nothing here knows which capacity a queue hands out: a run's queue is named by a
:class:`~.journal.ParkSpec` and made by the maker registered for its kind
(:func:`register_kind`, :func:`queue_for`) -- in a sweeper, in :mod:`.recovery` --
and :func:`park_message` parks a running message in any queue. This module registers
the semaphore's (:func:`parking_for`).

A singleton task keeps its lock while parked: the running lease is handed to the
parked message, as a ``retry()`` hands it to the next attempt.

May import the core and the shared glue (client, config, execution, signals).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from celery import Celery
from celery.app.task import Context
from kombu import serialization

from ...core.parking import Parked, ParkingQueue, ParkingSemaphore, RateCapacity, new_entry_id
from ...errors import ConfigurationError
from ..client import get_redis, replica_options
from ..config import restart_grace, settings_for
from ..execution import AnyTask, Hold, RunState
from ..request_state import RequestSlot
from ..signals import permit_parked
from ..tokens import HEADERS, PARK_HEADER, RESENT_HEADER, park_token
from ..upstream import request_context
from .journal import ParkSpec, forget, forget_if_taken, record
from .settings import park_keep, taken_memory

if TYPE_CHECKING:
    from celery.worker.request import Request

__all__ = [
    "ATTEMPT",
    "Kept",
    "claimed_publisher",
    "PARK_HEADER",
    "RESERVED",
    "SEMAPHORE",
    "SENT_HEADER",
    "QueueMaker",
    "decode_message",
    "encode_message",
    "encode_request",
    "LeaveQueue",
    "kinds",
    "leave_queues",
    "left_queue",
    "park_attempt",
    "park_header",
    "park_message",
    "park_run",
    "park_state",
    "parking_for",
    "publish_claimed",
    "queues_left",
    "set_park_attempt",
    "queue_for",
    "register_kind",
    "register_park_header",
    "reserved_at_intake",
    "semaphore_spec",
    "sent_at",
    "sent_token",
]

logger = logging.getLogger(__name__)

# PARK_HEADER (from tokens.py, which the singleton guard reads it from): a parked run's
# message, ``"<park token> <retries> <first refusal, epoch s>"``. ``retry()`` copies
# headers; the retries count in it tells a stale copy apart. A message published from
# a queue is marked re-sent by :func:`publish_claimed` (its one line is the "released"
# one), not by its park header: a rate-limited run admitted at send carries that header
# on its first and only publish, and its "received" line is the one it gets.

SENT_HEADER: Final = "redislock_sent"
"""Header of a bounded task's message: when ``apply_async`` sent it (epoch seconds,
the sender's clock; its ETA if later). A parked run takes its place in the queue by
it, so runs park in the order they were sent, whichever worker or process parks them
first (see :meth:`~celery_redislock.core.parking.ParkingSemaphore.park`)."""

_MAGIC: Final = b"RLP1"
ATTEMPT: Final = "_redislock_park_attempt"
"""Request-dict key (the intake's) and header (a park at send whose reply was lost): the
park token of an earlier attempt, which Celery shows the run as an attribute of its
request. Read with :func:`park_attempt`."""
_ATTEMPTS: Final[RequestSlot[str]] = RequestSlot("park attempt")
RESERVED: Final = "_redislock_intake_reserved"
"""Request-dict key (a header of the run): the park token of a fresh run whose
capacity the worker's intake reserved for it at once -- its message carries a park
header as a parked run's does, but it was never parked nor handed anything by a
release (see :func:`reserved_at_intake`)."""
_KEPT: Final = 1024

_Made = TypeVar("_Made")


class Kept(Generic[_Made]):
    """Per app, the :data:`_KEPT` most recently used objects made of its settings (a
    parking semaphore, a rate queue), each kept under everything it is made of: the
    client itself (held anyway by what is kept, so never confused with a later one at
    the same address) and every setting read into it. A setting left out of the key
    is a change made at run time that never reaches the object.

    The app is held weakly, and what is kept must not hold it (see
    :func:`claimed_publisher`): an app dropped takes its objects and its client along.
    Held strongly, a closed app's client outlived it -- and with it its metrics
    recorder, retrying forever events for a Redis that was gone, which every later
    ``flush()`` then waited for in vain."""

    def __init__(self) -> None:
        self._kept: weakref.WeakKeyDictionary[Celery, OrderedDict[tuple[Hashable, ...], _Made]] = (
            weakref.WeakKeyDictionary()
        )
        self._guard = threading.Lock()

    def get(self, app: Celery, key: tuple[Hashable, ...], make: Callable[[], _Made]) -> _Made:
        """The object kept for ``app`` under ``key``, else ``make()``'s, kept from now on."""
        with self._guard:
            kept = self._kept.get(app)
            made = None if kept is None else kept.get(key)
            if kept is not None and made is not None:
                kept.move_to_end(key)
                return made
        made = make()  # outside the guard: two threads may make one each, one is kept
        with self._guard:
            kept = self._kept.setdefault(app, OrderedDict())
            kept[key] = made
            while len(kept) > _KEPT:
                kept.popitem(last=False)
        return made


def claimed_publisher(app: Celery) -> Callable[[ParkingQueue, list[Parked]], None]:
    """``on_claimed`` of a queue of ``app``'s: :func:`publish_claimed` through it,
    holding it weakly (see :class:`Kept`). Once the app is gone -- nothing of it runs
    any more -- what is claimed goes back to its place for a sweeper to publish."""
    ref = weakref.ref(app)

    def publish(queue: ParkingQueue, claimed: list[Parked]) -> None:
        live = ref()
        if live is not None:
            publish_claimed(live, queue, claimed)
            return
        for entry in claimed:
            queue.give_back(entry.id)

    return publish


_semaphores: Final[Kept[ParkingSemaphore]] = Kept()


def encode_message(task: AnyTask, args: Any, kwargs: Any, options: dict[str, Any]) -> bytes:
    """The message to publish again, serialized as kombu would: ``RLP1 <content type>
    <content encoding>\\n<body>``."""
    body = {
        "task": task.name,
        "args": list(args or ()),
        "kwargs": dict(kwargs or {}),
        "options": options,
    }
    content_type, encoding, data = serialization.dumps(body, serializer=task.serializer)
    raw = data if isinstance(data, bytes) else str(data).encode(encoding or "utf-8")
    return b"%s %s %s\n%s" % (_MAGIC, content_type.encode(), encoding.encode(), raw)


def decode_message(
    app: Celery, payload: bytes
) -> tuple[str, list[Any], dict[str, Any], dict[str, Any]]:
    """``(task name, args, kwargs, options)`` of a parked message; raises ``ValueError``
    (or the serializer's error) for anything else. Only the content types the app
    accepts (``accept_content``) are decoded."""
    head, sep, data = payload.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != _MAGIC:
        raise ValueError(f"not a parked message (header {head[:40]!r})")
    content_type, encoding = parts[1].decode(), parts[2].decode()
    accept = serialization.prepare_accept_content(app.conf.accept_content)
    body = serialization.loads(data, content_type, encoding, accept=accept)
    if not isinstance(body, dict) or not isinstance(body.get("task"), str):
        raise ValueError("a parked message must be a dict naming its task")
    options = body.get("options")
    args, kwargs = body.get("args"), body.get("kwargs")
    if not isinstance(options, dict) or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("a parked message needs args (list), kwargs and options (dicts)")
    return body["task"], args, kwargs, options


def parking_for(
    app: Celery,
    pool: str,
    limit: int,
    ttl: float,
    prefix: str,
    acks: Mapping[str, Any] | None = None,
    standby: int = 0,
) -> ParkingSemaphore:
    """The parking semaphore of ``pool`` on the app's Redis (``acks``: the replica
    acknowledgement terms of its grants; ``standby``: runs published ahead, see
    :class:`~celery_redislock.core.parking.ParkingSemaphore`); claimed runs are
    published through the app. The recently used are kept (no per-lease state)."""
    client = get_redis(app)
    acks = replica_options(app) if acks is None else acks
    keep, grace, memory = park_keep(app), restart_grace(app), taken_memory(app)
    made_of = (client, prefix, pool, limit, ttl, standby, keep, grace, memory, *acks.items())
    return _semaphores.get(
        app,
        made_of,
        lambda: ParkingSemaphore(
            client,
            pool,
            limit=limit,
            ttl=ttl,
            prefix=prefix,
            keep=keep,
            on_claimed=claimed_publisher(app),
            standby=standby,
            restart_grace=grace,
            taken_memory=memory,
            **acks,
        ),
    )


SEMAPHORE: Final = "semaphore"
"""The kind of a bounded pool's capacity: its semaphore's permits."""

QueueMaker = Callable[[Celery, ParkSpec], ParkingQueue]
"""Makes the queue of a :class:`~.journal.ParkSpec` on an app's lock Redis, publishing
what it claims through the app (:func:`publish_claimed`)."""

_kinds: dict[str, QueueMaker] = {}


def register_kind(kind: str, maker: QueueMaker) -> None:
    """Let sweepers and recovery find the queues of capacity ``kind``."""
    _kinds[kind] = maker


def kinds() -> list[str]:
    """The capacity kinds registered (see :func:`register_kind`)."""
    return list(_kinds)


def queue_for(app: Celery, spec: ParkSpec) -> ParkingQueue:
    """The queue ``spec`` names (``ConfigurationError`` for a kind not registered or
    terms its maker refuses)."""
    maker = _kinds.get(spec.kind)
    if maker is None:
        raise ConfigurationError(f"no parking queue of capacity kind {spec.kind!r}")
    return maker(app, spec)


def semaphore_spec(sem: ParkingSemaphore, limit: int) -> ParkSpec:
    """What names the queue of ``sem`` (limit ``limit``) for a sweeper or recovery."""
    return ParkSpec(SEMAPHORE, sem.name, sem.keys.prefix, (limit, sem.ttl))


def _semaphore_queue(app: Celery, spec: ParkSpec) -> ParkingQueue:
    # No terms (a sweeper's): the limit stored with the pool applies, the app's TTL.
    limit, ttl = spec.terms or (1, settings_for(app).lock_ttl)
    return parking_for(app, spec.pool, int(limit), float(ttl), spec.prefix)


register_kind(SEMAPHORE, _semaphore_queue)


def publish_claimed(app: Celery, sem: ParkingQueue, claimed: list[Parked]) -> None:
    """Publish the parked runs a release (or a pump) claimed (one INFO line each). An
    entry that cannot be decoded goes to the dead-letter list (ERROR, with its task
    id) and its capacity on to the next; one the broker refuses goes back to its
    place."""
    dead = False
    queue = _queue_name(sem)
    for entry in claimed:
        try:
            name, args, kwargs, options = decode_message(app, entry.payload)
        except Exception as exc:
            logger.error(
                "celery_redislock: parked run %s of %s cannot be decoded (%s: %s); "
                "moved to the dead-letter list",
                entry.owner or entry.id,
                queue,
                type(exc).__name__,
                exc,
            )
            dead = sem.give_back(entry.id, dead=f"{type(exc).__name__}: {exc}") or dead
            forget(app, entry.id)
            continue
        try:
            # Not a child of the run whose release publishes it (Celery would list it
            # in that run's result, as if that run had sent it).
            # Marked re-sent: the line below is its one line, not Celery's "received".
            headers = {**(options.get("headers") or {}), RESENT_HEADER: "1"}
            app.send_task(
                name, args, kwargs, add_to_parent=False, **{**options, "headers": headers}
            )
        except Exception as exc:
            # The broker is down: the entry keeps its place; a sweeper claims it again.
            logger.warning(
                "celery_redislock: could not publish parked run %s[%s] of %s (%s); it stays parked",
                name,
                options.get("task_id"),
                queue,
                exc,
            )
            sem.give_back(entry.id)
            continue
        logger.info(
            "celery_redislock: %s[%s] released from the parked queue of %s",
            name,
            options.get("task_id"),
            queue,
        )
    if dead:
        sem.pump()  # the dead entry's capacity goes to the next one


def _queue_name(queue: ParkingQueue) -> str:
    """What a log line calls the capacity ``queue``'s runs wait for: "pool 'x'" for a
    semaphore, "rate limiter 'x'" for a rate (the name a user gave each)."""
    kind = queue.capacity.kind
    what = {SEMAPHORE: "pool", RateCapacity.kind: "rate limiter"}.get(kind, kind)
    return f"{what} {queue.capacity.name!r}"


class _QuietParked(logging.Filter):
    """Drops Celery's ``Task ... ignored`` INFO line of a run that was parked: its one
    line is ours (DEBUG when parked, INFO when released from the queue)."""

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if isinstance(data, dict) and data.get("description") == "ignored":
            with _parked_guard:
                return _recently_parked.pop(str(data.get("id")), None) is None
        return True


_recently_parked: OrderedDict[str, bool] = OrderedDict()
_parked_guard = threading.Lock()
logging.getLogger("celery.app.trace").addFilter(_QuietParked())


def _quiet(task_id: str) -> None:
    with _parked_guard:
        _recently_parked[task_id] = True
        while len(_recently_parked) > _KEPT:
            _recently_parked.popitem(last=False)


def park_attempt(request: Context) -> str | None:
    """The park token of an earlier attempt to park this request, if any: this run's
    own (:func:`set_park_attempt`), else its message's (:data:`ATTEMPT`)."""
    value = _ATTEMPTS.get(request)
    if value is None:
        value = getattr(request, ATTEMPT, None)  # Celery's attribute from the message
    return value if isinstance(value, str) else None


def set_park_attempt(request: Context, entry_id: str) -> None:
    """This run parks (again) under ``entry_id``: a park whose reply was lost to an
    outage is tried again under the same token (see outage.py), which never parks the
    run twice."""
    _ATTEMPTS.set(request, entry_id)


def sent_at(raw: Any) -> float | None:
    """The sending time in a :data:`SENT_HEADER` value, None if there is none."""
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def park_header(entry_id: str, retries: object, since: float) -> str:
    """The :data:`PARK_HEADER` value of a parked (or handed-over) run's message."""
    return f"{entry_id} {retries or 0} {since:.3f}"


def sent_token(task_id: Any, retries: Any, sent: Any) -> str:
    """The park token of a fresh message whose :data:`SENT_HEADER` is ``sent`` (µs)."""
    return park_token(str(task_id), int(retries or 0), f"sent {sent}".encode())


def park_state(request: Context, header: str = PARK_HEADER) -> tuple[str, float] | None:
    """``(park token, first refusal in epoch seconds)`` of a parked run's message (its
    ``header``: the bounded queue's, or another guard's), or None (no header, or one a
    ``retry()`` copied from an earlier attempt)."""
    raw = (request.headers or {}).get(header)
    try:
        entry_id, retries, since = str(raw).split()
        if int(retries) == (request.retries or 0):
            return entry_id, float(since)
    except (TypeError, ValueError):
        pass
    return None


def reserved_at_intake(request: Context, entry_id: str) -> bool:
    """True when the run of park token ``entry_id`` (from :func:`park_state`) had its
    capacity reserved at intake, as its message reached the worker: granted at once,
    not parked (a ``retry()`` copies the key with the park header; :func:`park_state`
    already refuses that stale header, and the token must match too)."""
    return (request.headers or {}).get(RESERVED) == entry_id


def encode_request(
    task: AnyTask, request: Request, entry_id: str, since: float, header: str = PARK_HEADER
) -> bytes:
    """The parked message of a worker's ``request`` (in the main process, before a pool
    process ran it), as :func:`park_message` encodes a running one."""
    return _payload(task, request_context(request), entry_id, since, (), header)


def _payload(
    task: AnyTask,
    context: Context,
    entry_id: str,
    since: float,
    holds: Iterable[Hold],
    header: str,
    left: tuple[str, ...] = (),
) -> bytes:
    sig = task.signature_from_request(context)
    options = dict(sig.options)
    # Not ours (they name this delivery), nor the intake's park token (a request key,
    # which Celery hands to the run as a header: the parked copy must not inherit it),
    # nor the tokens of the queues the run left.
    headers = {
        k: v
        for k, v in (options.get("headers") or {}).items()
        if k not in HEADERS and k not in (PARK_HEADER, header, ATTEMPT, RESERVED, *left)
    }
    headers[header] = park_header(entry_id, context.retries, since)
    for hold in holds:
        hold.on_park(headers)
    options["headers"] = headers
    return encode_message(task, sig.args, sig.kwargs, options)


def park_message(
    task: AnyTask,
    run: RunState,
    queue: ParkingQueue,
    spec: ParkSpec,
    since: float,
    header: str = PARK_HEADER,
) -> int:
    """Park the current request of ``task`` in ``queue`` (named by ``spec``; its parked
    message carries its park token in ``header``: the bounded queue's, or another
    guard's); its 1-based place in the queue (0: claimed at once). The caller then says
    so (its log line and signal) and ends the run with ``Ignore``.

    The holds of the run (a singleton lease) are handed to the parked message first,
    as to a retry; if parking fails they are kept by this run, which may try again.
    """
    request = task.request
    entry_id = park_attempt(request) or _fresh_token(request, header)
    set_park_attempt(request, entry_id)
    leaving = queues_left(request, header)
    payload = _payload(task, request, entry_id, since, run.holds, header, tuple(leaving))
    try:
        # Out of the other guard's queue first: a second message of a run that
        # started ends there (Ignore), before anything is journaled for it.
        leave_queues(task, leaving)
        # Journaled before the park: it survives the lock Redis.
        record(task.app, entry_id, payload, spec=spec, owner=run.task_id)
        position = queue.park(
            entry_id,
            payload,
            owner=run.task_id,
            sent=sent_at((request.headers or {}).get(SENT_HEADER)),
        )
    except BaseException:
        for hold in run.holds:
            hold.on_park_failed()
        raise
    for hold in run.holds:
        hold.on_parked()
    if position == 0:  # a copy whose run started already leaves no journal record
        forget_if_taken(task.app, queue, entry_id)
    _quiet(run.task_id)
    return position


def park_run(task: AnyTask, run: RunState, sem: ParkingSemaphore, since: float, limit: int) -> int:
    """Park the current bounded run of ``task`` in its pool's queue ``sem`` (see
    :func:`park_message`), with its DEBUG line and ``permit_parked``."""
    position = park_message(task, run, sem, semaphore_spec(sem, limit), since)
    waited = max(0.0, time.time() - since)
    logger.debug(
        "celery_redislock: %s[%s] over the limit of pool %r (%d): parked at place %d",
        task.name,
        run.task_id,
        sem.name,
        limit,
        position,
    )
    permit_parked.send(
        sender=task,
        task_id=run.task_id,
        key=sem.name,
        limit=limit,
        position=position,
        waited=waited,
    )
    return position


_park_headers: set[str] = {PARK_HEADER}

LeaveQueue = Callable[[AnyTask, str, bool], None]
"""Takes a run of ``task`` out of the queue its park token (``str``) came from, for
good (see :func:`register_park_header`). The ``bool``: this run tried that leave
before (an outage met it), so a token found consumed may be its own leave's doing;
else a consumed token means another message of the run took it -- this one must not
run (the leave raises ``Ignore``)."""

_leaving: dict[str, LeaveQueue] = {}


def register_park_header(header: str, leave: LeaveQueue | None = None) -> None:
    """Messages carrying ``header`` were published from a parking queue (another
    guard's, e.g. the rate limit's): a run of one refused here parks under a fresh
    token (see :func:`_fresh_token`).

    ``leave``: such a run parked in another queue (an earlier guard's: a run the rate
    limiter admitted, refused a concurrency permit) leaves the queue of ``header``
    first -- ``leave(task, token, again)`` consumes its token there and frees what it
    reserved (the rate charge, #25) -- and its parked message no longer carries
    ``header``: when it starts again, that guard decides afresh."""
    _park_headers.add(header)
    if leave is not None:
        _leaving[header] = leave


def queues_left(request: Context, header: str | None = None) -> dict[str, str]:
    """``{header: park token}`` of the queues the current run leaves (see
    :func:`register_park_header`) when it parks under ``header``, or (None) when it
    is re-sent to wait for a permit (``concurrency_park=False``): the re-sent
    message must not carry those headers (see :func:`leave_queues`)."""
    found = {}
    for other in _leaving:
        state = park_state(request, other) if other != header else None
        if state is not None:
            found[other] = state[0]
    return found


_LEFT: Final[RequestSlot[frozenset[str]]] = RequestSlot("queues left")
"""Beside a request: the headers of the queues its run left (see :func:`left_queue`)."""


def leave_queues(task: AnyTask, leaving: Mapping[str, str]) -> None:
    """Take the current run of ``task`` out of the queues ``leaving`` (from
    :func:`queues_left`) for good: before it parks elsewhere or is re-sent -- still
    claimed there, a lapsed claim would publish a second copy of the run, and a rate
    claim would stay charged for a run that has not started (#25). Re-sent after an
    outage, a leave changes nothing."""
    request = task.request
    for other, token in leaving.items():
        again = left_queue(request, other)
        # Noted first: a leave whose reply is lost may have consumed the token.
        _LEFT.set(request, (_LEFT.get(request) or frozenset()) | {other})
        _leaving[other](task, token, again)


def left_queue(request: Context, header: str) -> bool:
    """True when the run of ``request`` tried to leave the queue of ``header`` (see
    :func:`leave_queues`): its token there may be consumed by that leave, so when the
    run gets that far after all (an outage after the leave, and the permit free when
    the run tries again) and its take of that token is answered as a duplicate, that
    guard decides afresh (else it was skipped as a second message of its own parked
    run, and lost). Not before that take: a leave that never reached Redis left the
    token claimed for this run."""
    return header in (_LEFT.get(request) or frozenset())


def _fresh_token(request: Context, header: str) -> str:
    """The park token of a run refused in its pool process: a fresh message's is its
    intake token (see intake.py), so a delivery of it again (``acks_late``: a main killed
    before the ack) parks under the same token and changes nothing; a published parked
    run refused at its take -- published by any parking queue: a run parked for the
    rate, then refused a permit, has its intake token consumed in the permit queue
    already, and parking under it again was taken for a copy of a run that started and
    dropped (#25) -- or one without :data:`SENT_HEADER`, gets a random one."""
    sent = (request.headers or {}).get(SENT_HEADER)
    if sent is None or any(park_state(request, each) is not None for each in _park_headers):
        return new_entry_id()
    return sent_token(request.id, request.retries, sent)
