"""State of ours beside a Celery request (#30, celery/request_state.py): every run
sees its own -- an attempt after ``retry()`` (same task id) and the next run in the
same process see none of an earlier run's -- a direct call inside a body sees its
caller's, and nothing is left behind once the runs end."""

from __future__ import annotations

import gc
from typing import Any

import redis
from celery import Celery

from celery_redislock import RedisLockTask, rate_limited_task
from celery_redislock.celery import request_state
from celery_redislock.celery.bounded.parking import park_attempt
from celery_redislock.celery.execution import RunState, current_run
from celery_redislock.celery.ratelimit import guard

from .helpers import wait_until

RUNS = 200


def _kept_after_collect() -> int:
    gc.collect()
    return request_state.kept()


def test_eager_runs_and_retries_each_see_their_own_run_and_leave_nothing(
    app: Celery, locks: redis.Redis
) -> None:
    before = _kept_after_collect()
    seen: list[tuple[int, int, RunState | None, bool]] = []

    @app.task(base=RedisLockTask, bind=True, singleton=True, concurrency_limit=4, max_retries=1)
    def job(self: Any, n: int) -> int:
        run = current_run(self)
        seen.append((n, self.request.retries, run, run is not None and run.finished))
        if n == 0 and not self.request.retries:
            # Eager: the next attempt runs inside this one, same task id.
            raise self.retry(countdown=0)
        if n == 1:
            assert self(-1) == -1  # a direct call: the body alone, in this request
        return n

    job.apply((0,))
    (_, retries_1, first, _), (_, retries_2, second, finished) = seen
    assert (retries_1, retries_2) == (0, 1)
    assert first is not None and second is not None and second is not first
    assert not finished  # the attempt saw its own run, live, not the first's

    seen.clear()
    assert job.apply((1,)).get() == 1
    (_, _, outer, _), (_, _, inner, _) = seen
    assert outer is not None and inner is outer  # a copy of the request sees its state
    assert outer is not first and outer is not second

    seen.clear()
    for n in range(2, 2 + RUNS):
        assert job.apply((n,)).get() == n
    runs = {id(run) for _, _, run, _ in seen}
    assert len(runs) == RUNS and not any(finished for *_, finished in seen)
    assert all(run is not None and run.finished for _, _, run, _ in seen)
    del seen[:], first, second, outer, inner
    assert _kept_after_collect() <= before  # nothing outlives its run


def test_worker_runs_of_one_process_see_none_of_each_others_state(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    before = _kept_after_collect()
    seen: list[tuple[str, int, str | None, str | None]] = []

    @rate_limited_task(
        app=app, global_rate_limit="1000/s", concurrency_limit=4, bind=True, max_retries=1
    )
    def call(self: Any, n: int) -> int:
        request = self.request
        seen.append(
            (request.id, request.retries, guard._OWNERS.get(request), park_attempt(request))
        )
        if n == 0 and not request.retries:
            raise self.retry(countdown=0)  # the next attempt: same id, a new message
        return n

    worker(app, concurrency=2)
    results = [call.delay(n) for n in range(40)]
    assert [r.get(timeout=30) for r in results] == list(range(40))
    assert len(seen) == 41
    owners = [owner for _, _, owner, _ in seen]
    # Each run took its admission under an owner of its own, its task id's.
    assert all(owner and owner.startswith(f"{task_id}@") for task_id, _, owner, _ in seen)
    assert len(set(owners)) == 41  # the retried attempt too: not its first's
    assert [retries for task_id, retries, _, _ in seen if task_id == results[0].id] == [0, 1]
    assert not any(attempt for *_, attempt in seen)  # none parked: no park token seen
    # The last run's request is dropped just after its result is stored.
    wait_until(lambda: _kept_after_collect() <= before, what="the runs' state to go")
