"""A run that cannot reach the lock Redis when it starts waits for it, in place.

When Redis is unreachable at ``before_start`` (stopped, restarting, a network cut),
failing the run would lose the task: its message is acknowledged already, and
``autoretry_for`` cannot help (the guards run outside the body). Re-publishing it
would not survive either when the broker is the same Redis (the publish fails too),
and a countdown message is exactly what kombu's Redis transport loses or crashes on
during an outage (see the README). So the run stays where it is: the guard that met
the error is tried again after a backoff (0.25 s doubling to 2 s), holds taken
before it are kept (renewed, or reported lost), up to ``redislock_outage_attempts``
attempts (60: over two minutes with redis-py's own retries); ``max_retries`` is not
spent. After the last attempt the run fails with :class:`~..errors.RedisUnavailable`
naming the setting. One WARNING when a run starts waiting, one INFO when it goes on.

That is for a Redis that answered before. A ``redislock_url`` that has **never**
answered since the worker started (a wrong host or port) is a configuration error,
not an outage: the run fails at once with :class:`~..errors.ConfigurationError`
naming ``redislock_url`` and its (masked) value, instead of holding its worker process
for minutes (#29 item 5). The worker says so when it starts (:func:`connect`: it
pings the lock Redis on ``worker_init``, before the pool forks, so its children know
too). On the client, :func:`client_error` makes an error of the lock Redis in
``apply_async`` say it is the lock Redis (``redislock_url``), not the broker, and a
``RedisRestarting`` name the setting of its grace (``redislock_restart_grace``).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import threading
import time
import weakref
from typing import Any, Final

import redis
from celery import Celery, signals

from ..errors import ConfigurationError, RedisLockError, RedisRestarting, RedisUnavailable
from .cleanup import guards_of
from .client import connection_source, get_redis
from .config import restart_grace
from .execution import AnyTask, Guard, Hold, RunState
from .sentinel import masked_url

__all__ = [
    "DEFAULT_ATTEMPTS",
    "OUTAGE_ERRORS",
    "client_error",
    "connect",
    "enter_guard",
    "has_answered",
    "lock_redis",
    "outage_attempts",
]

logger = logging.getLogger(__name__)

DEFAULT_ATTEMPTS: Final = 60
"""Attempts of a guard whose Redis is unreachable before the run fails."""

OUTAGE_ERRORS: Final = (redis.ConnectionError, redis.TimeoutError)
"""What an unreachable Redis raises (``BusyLoadingError`` while a restarted Redis
loads its data is a ``ConnectionError``)."""

_FIRST_DELAY: Final = 0.25
_MAX_DELAY: Final = 2.0
_START_PING: Final = 3.0  # seconds the worker's start waits for the lock Redis's PONG

# Outage errors that are replies of the lock Redis: its URL is right.
_ANSWERS: Final = (RedisRestarting, redis.BusyLoadingError)

# Apps whose lock Redis answered this process (or the worker's main before the fork).
_answered: weakref.WeakKeyDictionary[Celery, bool] = weakref.WeakKeyDictionary()

# Per app, a flag in memory shared by the worker's main and every pool process it
# forks (made on worker_init, before the pool): set by whichever process first sees
# the lock Redis answer, so a child forked later, or one that never ran a task yet,
# knows it answered (#29 item 5: a fresh child failed its run at once through an
# outage of a Redis that answered after the worker started, instead of waiting).
_shared: weakref.WeakKeyDictionary[Celery, ctypes.c_bool] = weakref.WeakKeyDictionary()


def lock_redis(app: Celery) -> str:
    """``redislock_url='<masked>'`` of ``app``, or what it defaults to, for messages."""
    try:
        raw, options = connection_source(app)
    except RedisLockError:
        return "redislock_url (unset)"
    url = masked_url(raw)
    if app.conf.get("redislock_url") is None:
        # Which of the two it is: a user with a Redis broker and a Redis backend on
        # different servers must not have to guess which one holds the locks.
        source = "broker" if options == "broker_transport_options" else "result backend"
        return f"redislock_url (unset: the {source}'s {url!r})"
    return f"redislock_url={url!r}"


def _answer(app: Celery) -> None:
    if app not in _answered:
        _answered[app] = True
    flag = _shared.get(app)
    if flag is not None and not flag.value:
        flag.value = True


def has_answered(app: Celery) -> bool:
    """True once ``app``'s lock Redis answered this process, or the worker's main
    process before it forked this one (the ping at its start, or any reply since)."""
    flag = _shared.get(app)
    return app in _answered or (flag is not None and bool(flag.value))


def outage_attempts(app: Celery) -> int:
    """``redislock_outage_attempts``, checked: an int >= 1 (1: fail at once)."""
    value = app.conf.get("redislock_outage_attempts", DEFAULT_ATTEMPTS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"redislock_outage_attempts must be an int >= 1, got {value!r}")
    return value


def enter_guard(
    guard: Guard, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Hold | None:
    """``guard.enter(...)``, tried again while Redis is unreachable (see the module)."""
    try:
        hold = guard.enter(task, run, args, kwargs)
    except OUTAGE_ERRORS as first:
        error: BaseException = first
    else:
        if hold is not None:  # it took something: Redis answered
            _answer(task.app)
        return hold
    if isinstance(error, _ANSWERS):
        _answer(task.app)  # it answered: restarted (within its grace) or loading
    elif not has_answered(task.app):
        raise ConfigurationError(
            f"task {task.name}[{run.task_id}]: the lock Redis, {lock_redis(task.app)}, has "
            f"not answered since this worker started ({type(error).__name__}: {error}); "
            "check redislock_url (an outage of a Redis that answered before is waited "
            "for, up to redislock_outage_attempts)"
        ) from error
    attempts, started = outage_attempts(task.app), time.monotonic()
    logger.warning(
        "celery_redislock: %s[%s] cannot reach the lock Redis (%s); waiting for "
        "it (up to %d attempts)",
        task.name,
        run.task_id,
        error,
        attempts,
    )
    delay = _FIRST_DELAY
    for attempt in range(2, attempts + 1):
        time.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY)
        try:
            hold = guard.enter(task, run, args, kwargs)
        except OUTAGE_ERRORS as exc:
            error = exc
            continue
        logger.info(
            "celery_redislock: %s[%s] reached the lock Redis again after %.1fs (attempt %d)",
            task.name,
            run.task_id,
            time.monotonic() - started,
            attempt,
        )
        return hold
    raise RedisUnavailable(
        f"task {task.name}[{run.task_id}]: the lock Redis, {lock_redis(task.app)}, was "
        f"unreachable for {attempts} attempts over {time.monotonic() - started:.0f}s "
        f"({type(error).__name__}: {error}); it answered before, so this is an outage: "
        "raise redislock_outage_attempts to wait longer"
    ) from error


def client_error(app: Celery, error: BaseException) -> BaseException:
    """An error of the lock Redis met by ``apply_async``, saying so: a connection error
    names the lock Redis (``redislock_url``, masked; the broker may be the same
    server, but this call failed on the locks), a ``RedisRestarting`` the setting its
    grace comes from. Same class (a ``redis.ConnectionError`` stays one)."""
    if isinstance(error, RedisRestarting):
        grace = restart_grace(app)
        value = "lock_ttl/3 + 2 s, at most lock_ttl" if grace is True else f"{grace!r}"
        return RedisRestarting(f"{error} (redislock_restart_grace: {value})")
    message = f"the lock Redis, {lock_redis(app)}, is unreachable: {error}"
    try:
        return type(error)(message)
    except Exception:  # an error class with another signature
        return redis.ConnectionError(message)


def connect() -> None:
    """Ping the lock Redis when a worker starts (see the module); once per process."""
    signals.worker_init.connect(_on_worker_init, dispatch_uid="celery_redislock.outage")
    # Said once the worker's logging is set up: ``worker_init`` comes before it (an
    # INFO line there went nowhere, an ERROR line came out unformatted, without the
    # worker's timestamp); ``celeryd_after_setup`` for ``celery worker``, else (a
    # worker started in process, as the test helpers do) ``worker_ready``.
    signals.celeryd_after_setup.connect(
        _on_after_setup, dispatch_uid="celery_redislock.outage.after_setup"
    )
    signals.worker_ready.connect(_on_ready, dispatch_uid="celery_redislock.outage.ready")


# What the start's ping found, per app, until it is logged.
_start_report: weakref.WeakKeyDictionary[Celery, tuple[int, str, tuple[object, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _report_start(app: object) -> None:
    if not isinstance(app, Celery):
        return
    report = _start_report.pop(app, None)
    if report is not None:
        level, message, args = report
        logger.log(level, message, *args)


def _on_after_setup(sender: object = None, instance: object = None, **_: object) -> None:
    _report_start(getattr(instance, "app", None))


def _on_ready(sender: object = None, **_: object) -> None:
    _report_start(getattr(sender, "app", None))


def _on_worker_init(sender: object = None, **_: object) -> None:
    # sender: the WorkController
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        if not any(guards_of(task) for task in app.tasks.values()):
            return  # no task of ours: nothing to check
        client, name = get_redis(app), lock_redis(app)
    except RedisLockError:  # no lock Redis configured: the first run says so
        return
    if app not in _shared:
        _shared[app] = multiprocessing.RawValue(ctypes.c_bool, app in _answered)
    outcome: list[BaseException | None] = []

    def ping() -> None:
        try:
            client.ping()
        except _ANSWERS:
            pass  # a reply all the same: the URL is right
        except Exception as exc:
            outcome.append(exc)
            return
        _answer(app)
        outcome.append(None)

    # In a thread: a black-holed address must not hold the worker's start for the
    # client's whole timeout and retries.
    thread = threading.Thread(target=ping, name="celery-redislock-ping", daemon=True)
    thread.start()
    thread.join(_START_PING)
    if outcome and outcome[0] is None:
        _start_report[app] = (
            logging.INFO,
            "celery_redislock: the lock Redis, %s, answers",
            (name,),
        )
        return
    why = (
        f"{type(outcome[0]).__name__}: {outcome[0]}" if outcome else f"no reply in {_START_PING:g}s"
    )
    _start_report[app] = (
        logging.ERROR,
        "celery_redislock: the lock Redis, %s, does not answer (%s): runs of tasks "
        "with singleton locks, concurrency limits or global rate limits fail at once "
        "until it has answered (check redislock_url)",
        (name, why),
    )
