"""The singleton guard: the worker's side of the per-signature lock.

When a run starts it adopts the queued lease its message carries (token header) under
its execution token (:func:`~..tokens.run_token`) and a running owner id, with a short
lease (``lock_ttl``) renewed while it runs. Without a live queued lease (``send_task``,
beat bypassing ``apply_async``, a queued lease that lapsed) it takes the lock afresh.
If another copy holds the lock, this copy is a **runtime duplicate**: it is skipped
(``Ignore``) or re-sent with a countdown, logged and signalled, and it releases
nothing -- it holds nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from ...core import Lease, RedisLock, RedlockLock
from ...core.redlock import RedlockLease
from ...core.redlock.lease import keep_alive as redlock_keep_alive
from ...core.renewal import keep_alive
from ..execution import AnyTask, Cleanup, Guard, Hold, RunState
from ..logs import LEASE
from ..options import options_of
from ..signals import lease_lost, singleton_acquired, singleton_released
from ..tokens import (
    KEY_HEADER,
    NONCE_HEADER,
    PARK_HEADER,
    TOKEN_HEADER,
    run_token,
    running_owner,
)
from . import queued
from .duplicates import runtime_duplicate
from .leases import extend_token, hand_over, lock_for, release_token
from .lookup import queued_key
from .options import SingletonOptions
from .percall import BYPASS_HEADER, run_lock_ttl
from .signature import received_key

__all__ = ["SINGLETON", "SingletonGuard", "SingletonHold"]


def _report_lost(
    task: AnyTask, task_id: str, key: str, lease: Lease, reason: str | None = None
) -> None:
    if lease.released:  # found by its own release: the run ended (or its give-back, later)
        LEASE.error(
            "celery_redislock: task %s[%s] found its singleton lock %r no longer held when "
            "giving it back (%s)",
            task.name,
            task_id,
            key,
            reason or lease.lost_reason,
        )
    else:
        # Runs on the renewal thread. Celery cannot stop a running body safely, so the
        # task goes on; users who must stop can watch lease.lost_event (see the README).
        LEASE.error(
            "celery_redislock: task %s[%s] lost its singleton lock %r while running (%s); "
            "another copy may start",
            task.name,
            task_id,
            key,
            lease.lost_reason,
        )
    lease_lost.send(sender=task, task_id=task_id, key=key, fence=lease.fence, kind="lock")


def _quiet(lease: Lease) -> None:
    """``on_lost`` of a lease being handed to a parked run (see ``on_park``)."""


class SingletonHold(Hold):
    """The running lease of one run."""

    def __init__(
        self, task: AnyTask, task_id: str, key: str, lease: Lease, options: SingletonOptions
    ) -> None:
        self.task, self.task_id, self.key, self.lease = task, task_id, key, lease
        self.options = options
        self.handed_over = False
        self.retry_ttl = 0.0
        self.parking = False
        self._saved_on_lost: Callable[[Lease], None] | None = None

    def __repr__(self) -> str:
        return (
            f"<SingletonHold {self.key!r} of {getattr(self.task, 'name', '?')}"
            f"[{self.task_id}] fence={self.lease.fence}>"
        )

    def finish(self, reason: str) -> bool:
        """Release the lease (mode ``interval``: keep it ``singleton_interval`` more);
        False when it was no longer held."""
        if self.handed_over:
            return True
        if self.options.mode == "interval":
            assert self.options.interval is not None
            reported = self.lease.lost
            if not self.lease.released:
                released = hand_over(self.lease, self.options.interval)
            else:
                # A give-back's retry (see giveback.py): the hand-over forgot the lease
                # here before its call failed, so set the TTL by token.
                lock = lock_for(self.task, self.key, self.options)
                released = extend_token(lock, self.lease.token, self.options.interval)
            if not released and not reported:  # a hand-over reports no loss itself
                _report_lost(
                    self.task, self.task_id, self.key, self.lease, "its interval was not set"
                )
            reason = f"{reason} (held {self.options.interval:g}s more: interval)"
        else:
            released = self.lease.release()
        singleton_released.send(
            sender=self.task,
            task_id=self.task_id,
            key=self.key,
            reason=reason,
            released=released,
            stage="run",
        )
        return released

    def on_retry(self, key: str | None, delay: float, headers: dict[str, Any]) -> None:
        """Hand the running lease to the retry message, kept through its countdown."""
        if key != self.key or self.lease.released or self.lease.lost:
            return  # other arguments, other lock: the retry takes its own
        if self.options.mode == queued.MODE:
            return  # the retry queues like a new copy; the running lock ends with the run
        self.retry_ttl = delay + self.options.queued_ttl
        if hand_over(self.lease, self.retry_ttl):
            headers[TOKEN_HEADER], headers[KEY_HEADER] = self.lease.token, key
            self.handed_over = True

    def on_park(self, headers: dict[str, Any]) -> None:
        """Name the running lease in the parked message's headers (its run adopts it).

        Still held and renewed here until :meth:`on_parked`, so a failed park leaves
        it ours; meanwhile a loss is not reported: the parked run, published at once
        when a permit is free, may adopt it first.
        """
        if self.lease.released or self.lease.lost:
            return
        headers[TOKEN_HEADER], headers[KEY_HEADER] = self.lease.token, self.key
        self._saved_on_lost, self.lease.on_lost = self.lease.on_lost, _quiet
        self.parking = True

    def on_parked(self) -> None:
        """Hand the lease to the parked message, kept ``lock_queued_ttl`` (False from
        the hand-over: its run adopted it already)."""
        if self.parking:
            hand_over(self.lease, self.options.queued_ttl)
            self.handed_over, self.parking = True, False

    def on_park_failed(self) -> None:
        """Keep the lease: report its loss again."""
        if self.parking:
            self.lease.on_lost, self.parking = self._saved_on_lost, False

    def on_retry_published(self) -> None:
        """Set the TTL once more: a renewal in flight when renewal stopped may have
        shortened it (a no-op once the next attempt adopted the lease)."""
        if self.handed_over:
            lock = self.lease.holder
            assert isinstance(lock, (RedisLock, RedlockLock))
            extend_token(lock, self.lease.token, self.retry_ttl)

    def on_retry_failed(self) -> None:
        """The retry was not published: release now (``retry()`` then ends the run)."""
        if self.handed_over:
            self.handed_over = False
            lock = self.lease.holder
            assert isinstance(lock, (RedisLock, RedlockLock))
            released = release_token(lock, self.lease.token)
            singleton_released.send(
                sender=self.task,
                task_id=self.task_id,
                key=self.key,
                reason="publish-failed",
                released=released,
                stage="run",
            )


class SingletonGuard(Guard):
    """Takes the singleton lock when a run starts; see the module docs."""

    def enter(
        self, task: AnyTask, run: RunState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Hold | None:
        """Adopt the queued lease, or take the lock afresh, or skip as a duplicate."""
        options = options_of(task).singleton
        if not options.enabled:
            return None
        request = task.request
        headers = request.headers or {}
        if request.is_eager and request.retries:
            # An eager retry re-runs through apply() with the first attempt's headers
            # (celery's Task.apply copies them), never through apply_async: stale here.
            headers = {}
        if BYPASS_HEADER in headers:  # sent with singleton=False: no lock for this call
            return None
        token, nonce = headers.get(TOKEN_HEADER), headers.get(NONCE_HEADER)
        key = headers.get(KEY_HEADER) or received_key(task, args, kwargs, None, options)
        lock = lock_for(task, key, options)
        if not options.lock_while_running:  # until_started: let go as the run starts
            if token and release_token(lock, token):
                singleton_released.send(
                    sender=task,
                    task_id=run.task_id,
                    key=key,
                    reason="STARTED",
                    released=True,
                    stage="run",
                )
            return None
        owner = running_owner(run.task_id)
        on_lost = functools.partial(_report_lost, task, run.task_id, key)
        ttl = run_lock_ttl(headers, options.lock_ttl)
        lease = None
        in_queue = options.mode == queued.MODE  # the token is the queued lock's
        handed = False
        if token:
            # In mode until_and_while_executing the token names the queued lock's lease,
            # except in a parked run's message: there it names the running lease the
            # run was handed when it parked (SingletonHold.on_park), which it adopts
            # (else it found its own lock held and was re-sent until it lapsed).
            lease = lock.adopt(
                token, new_token=run_token(token), owner=owner, ttl=ttl, renew=True, on_lost=on_lost
            )
            if lease is not None:
                in_queue = False  # it holds no queued lease to give back
            elif in_queue and _parked(headers, request.retries):
                # The running lease it was handed lapsed while parked: it holds no
                # queued lease either, so a newer call holding the queued lock is the
                # next copy, not a sign that this one is stale (leave_queue).
                handed = True
        if lease is None:
            seed = token or nonce
            fresh, holder = lock.try_acquire(
                owner=owner, ttl=ttl, renew=not seed, on_lost=None if seed else on_lost
            )
            if fresh is None:
                if in_queue:
                    queued.wait_in_queue(task, run, key, holder, options, token)
                runtime_duplicate(task, run, key, holder, options)
            assert fresh is not None
            lease = fresh
            if seed:  # move to the execution token the main process can recompute
                lease = (
                    lock.adopt(
                        fresh.token, new_token=run_token(seed), ttl=ttl, renew=True, on_lost=on_lost
                    )
                    or fresh
                )
                if lease is fresh:  # cannot happen while we hold it; keep it anyway
                    fresh.on_lost = on_lost
                    if isinstance(fresh, RedlockLease) and isinstance(lock, RedlockLock):
                        redlock_keep_alive(fresh, lock)
                    else:
                        keep_alive(fresh)
            if in_queue and not handed:
                queued.leave_queue(task, run, key, lease, options, token)
            elif token:
                LEASE.warning(
                    "celery_redislock: the queued lease of %s[%s] had lapsed (longer in "
                    "the queue than lock_queued_ttl?); the lock was free and is taken "
                    "afresh: the task runs",
                    task.name,
                    run.task_id,
                )
        singleton_acquired.send(
            sender=task, task_id=run.task_id, key=key, fence=lease.fence, stage="run"
        )
        return SingletonHold(task, run.task_id, key, lease, options)

    def cleanup(self, task: AnyTask, event: Cleanup) -> None:
        """Release (or, mode ``interval``, keep for the interval) what the run held."""
        options = options_of(task).singleton
        if not options.enabled:
            return
        for headers in event.deliveries:
            key = headers.get(KEY_HEADER)
            if key is None and event.args is not None:
                key = received_key(task, event.args, event.kwargs, None, options)
            if key is None:
                continue
            lock = lock_for(task, key, options)
            token, nonce = headers.get(TOKEN_HEADER), headers.get(NONCE_HEADER)
            if token:  # the queued lease, if the run never adopted it
                qlock = (
                    lock_for(task, queued_key(key), options)
                    if (options.mode == queued.MODE)
                    else lock
                )
                done = release_token(qlock, token)
                if not done and qlock is not lock:
                    # A parked run's message names the running lease it was handed
                    # (SingletonHold.on_park), not a queued one.
                    done = release_token(lock, token)
                _cleanup_release(task, event, key, done)
            if not event.started or not options.lock_while_running:
                continue
            for seed in filter(None, (token, nonce)):
                if options.mode == "interval" and options.interval is not None:
                    done = extend_token(lock, run_token(seed), options.interval)
                else:
                    done = release_token(lock, run_token(seed))
                if done:
                    _cleanup_release(task, event, key, done)


def _parked(headers: Mapping[str, object], retries: int | None) -> bool:
    """True for a parked run's message (not a header a ``retry()`` copied)."""
    parts = str(headers.get(PARK_HEADER) or "").split()
    return len(parts) == 3 and parts[1] == str(retries or 0)


def _cleanup_release(task: AnyTask, event: Cleanup, key: str, released: bool) -> None:
    if released:
        LEASE.info(
            "celery_redislock: released the singleton lock %r of %s[%s] after %s",
            key,
            task.name,
            event.task_id,
            event.event,
        )
        singleton_released.send(
            sender=task,
            task_id=event.task_id,
            key=key,
            reason=event.event,
            released=True,
            stage="cleanup",
        )


SINGLETON = SingletonGuard()
"""The guard instance every ``RedisLockTask`` lists first in ``redislock_guards``."""
