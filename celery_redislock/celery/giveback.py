"""Holds a run could not give back during an outage, given back when Redis answers.

A run gives its holds back when it ends (:meth:`.execution.RunState.finish`). When the
lock Redis is unreachable then, the release fails; left alone, the lease would stay
held until it expires (``lock_ttl``) although its run is over: a pool idles, and a
singleton's ``delay()`` keeps returning the finished run's id (#29 item 3). The
process knows those holds, so :func:`give_back_later` keeps them and one thread per
process tries them again every :data:`INTERVAL` seconds until each is given back or
has expired by itself (its lease's TTL since the failure: nothing renews it meanwhile).

Each try is the hold's own ``finish`` again: a release by token, owner-checked on the
server, so a lease that was lost meanwhile (expired, taken over, forgotten by a Redis
restarted empty) is never touched -- the release answers "not ours", the loss is
reported as for any release (the lease's ``lease_lost``), and the give-back says it
was not given back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Final, Protocol

import redis

__all__ = ["INTERVAL", "OUTAGE_ERRORS", "give_back_later", "pending"]

logger = logging.getLogger("celery_redislock.celery.execution")

OUTAGE_ERRORS: Final = (redis.ConnectionError, redis.TimeoutError)
"""What an unreachable Redis raises; other errors are not tried again."""

INTERVAL: Final = 0.25
"""Seconds between tries (each try is a release call with redis-py's own retries)."""

_DEFAULT_TTL: Final = 30.0


class _Hold(Protocol):
    # What this module needs of an execution.Hold (execution imports this module).
    def finish(self, reason: str) -> bool: ...


@dataclass
class _Pending:
    hold: _Hold
    reason: str
    task_name: str
    task_id: str
    failed_at: float
    expires_at: float


_pending: list[_Pending] = []
_cond = threading.Condition()
_thread: threading.Thread | None = None


def give_back_later(hold: _Hold, reason: str, task_name: str, task_id: str) -> None:
    """Keep ``hold`` (whose ``finish(reason)`` failed on an outage error) and try its
    ``finish`` again until it succeeds or its lease has expired by itself."""
    global _thread
    now = time.monotonic()
    ttl = getattr(getattr(hold, "lease", None), "ttl", None)
    ttl = float(ttl) if isinstance(ttl, (int, float)) and ttl > 0 else _DEFAULT_TTL
    with _cond:
        _pending.append(_Pending(hold, reason, task_name, task_id, now, now + ttl))
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="celery-redislock-give-back", daemon=True)
            _thread.start()
        _cond.notify()


def pending() -> int:
    """Holds still waiting to be given back in this process."""
    with _cond:
        return len(_pending)


def _run() -> None:
    while True:
        with _cond:
            if not _pending:
                _cond.wait(10 * INTERVAL)
                if not _pending:
                    return
            todo = list(_pending)
        for item in todo:
            done = _try(item)
            if done:
                with _cond:
                    _pending.remove(item)
        time.sleep(INTERVAL)


def _try(item: _Pending) -> bool:
    """One try of ``item``; True when it is settled (given back, not ours, expired)."""
    now = time.monotonic()
    try:
        given_back = item.hold.finish(item.reason)
    except OUTAGE_ERRORS:
        if now < item.expires_at:
            return False
        logger.warning(
            "celery_redislock: gave up giving back %r of %s[%s]: the lock Redis did not "
            "answer for %.1fs; it has expired by itself",
            item.hold,
            item.task_name,
            item.task_id,
            now - item.failed_at,
        )
        return True
    except Exception:
        logger.exception(
            "celery_redislock: could not give back %r of %s[%s]; it expires by itself",
            item.hold,
            item.task_name,
            item.task_id,
        )
        return True
    if not given_back:
        logger.error(
            "celery_redislock: %r of %s[%s] was no longer held when the lock Redis answered "
            "again %.1fs after its run ended (expired, released by force or lost with the "
            "server's data): not given back, reported lost",
            item.hold,
            item.task_name,
            item.task_id,
            now - item.failed_at,
        )
        return True
    logger.warning(
        "celery_redislock: gave back %r of %s[%s] %.1fs after its run ended, once the "
        "lock Redis answered again",
        item.hold,
        item.task_name,
        item.task_id,
        now - item.failed_at,
    )
    return True


def _forget_in_child() -> None:
    """A forked child inherits the parent's list but not its thread: start empty (the
    parent gives its own holds back)."""
    global _thread, _pending, _cond
    _pending = []
    _cond = threading.Condition()
    _thread = None


os.register_at_fork(after_in_child=_forget_in_child)
