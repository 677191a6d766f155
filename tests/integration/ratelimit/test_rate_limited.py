"""Global rate limits with real workers (#25): over the rate a run is parked and
started at its admission time, never retried, never holding a worker process."""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import RateLimited, RedisLockTask, RedisRateLimiter, rate_limited_task
from celery_redislock.celery.bounded import parking
from celery_redislock.celery.signals import permit_rescheduled, rate_duplicate, rate_limited
from celery_redislock.core.parking import ParkingQueue
from celery_redislock.errors import ConfigurationError

pytestmark = [pytest.mark.slow, pytest.mark.serial]

WAY = 0.1
"""Seconds a run's body may start after its admission. The limiter holds N per period
on admissions, by the lock Redis's clock; a body's ``time.time()`` comes later by the
way back from the script and Celery's start of the task, a few ms idle and up to
~50 ms under load (CI at load 5: 5 bodies in 0.968 s, admissions 1 s apart; the
margin was -1.5 to +19 ms in 8 runs here at load 4). So windows of body starts are
``period - WAY`` long."""


def _windows(starts: list[float], period: float) -> int:
    """The most starts in any window of ``period`` (interval sweep)."""
    starts = sorted(starts)
    most, low = 0, 0
    for high, at in enumerate(starts):
        while at - starts[low] >= period:
            low += 1
        most = max(most, high - low + 1)
    return most


def test_a_backlog_runs_once_each_at_the_rate_and_a_plain_task_is_not_held(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    limited = capture(rate_limited)
    runs: dict[str, tuple[float, int]] = {}

    @rate_limited_task(app=app, global_rate_limit="5/s", global_rate_key="api", bind=True)
    def call(self: Any, n: int) -> int:
        runs[self.request.id] = (time.time(), self.request.retries)
        return n

    @app.task
    def plain() -> float:
        return time.time()

    worker(app, concurrency=4)
    sent = time.time()
    results = [call.delay(n) for n in range(15)]
    time.sleep(0.5)
    plain_sent = time.time()
    plain_started = plain.delay().get(timeout=10)
    assert [r.get(timeout=20) for r in results] == list(range(15))
    assert len(runs) == 15 and all(retries == 0 for _, retries in runs.values())
    starts = [at for at, _ in runs.values()]
    assert _windows(starts, 1.0 - WAY) <= 5  # at most 5 in any 1 s window
    assert max(starts) - sent >= 2.0  # 15 at 5/s: the last admitted after 2 s
    assert plain_started - plain_sent < 1.0  # no worker process was held meanwhile
    assert len(limited) == 10 and {s["key"] for s in limited} == {"api"}


def test_a_429_penalizes_the_limiter_and_parks_the_run_again(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    limited = capture(rate_limited)
    attempts: list[tuple[float, int]] = []

    @rate_limited_task(app=app, global_rate_limit="100/s", bind=True)
    def call(self: Any) -> str:
        attempts.append((time.time(), self.request.retries))
        if len(attempts) == 1:
            raise RateLimited("429 Too Many Requests", retry_after=1.0)
        return "done"

    worker(app, concurrency=2)
    assert call.delay().get(timeout=15) == "done"
    (first, retries_1), (second, retries_2) = attempts
    assert (retries_1, retries_2) == (0, 0)  # not a retry
    assert second - first >= 0.9  # held back by the penalty, for every worker
    assert len(limited) == 1


@pytest.mark.parametrize("rate", ["abc", "0/s", "-1/s", "10/x", "", [], ["10/s", "nope"], 5])
def test_a_bad_rate_is_refused_naming_the_option(app: Celery, rate: Any) -> None:
    # The task too, as every other option's error does (a new user's '5/sec', #29:
    # before, "global_rate_limit must be a rate ..., got '5/sec'" named no task).
    with pytest.raises(ConfigurationError, match=r"^task '[\w.]*call': option global_rate_limit"):

        @rate_limited_task(app=app, global_rate_limit=rate)
        def call() -> None: ...


def test_a_bad_key_is_refused_naming_the_option(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match=r"^task '[\w.]*call': option global_rate_key"):

        @rate_limited_task(app=app, global_rate_limit="1/s", global_rate_key=42)
        def call() -> None: ...


def test_a_rate_and_a_concurrency_limit_hold_together(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    spans: list[tuple[float, float, int]] = []

    @rate_limited_task(
        app=app, global_rate_limit="4/s", concurrency_limit=2, concurrency_key="api", bind=True
    )
    def call(self: Any, n: int) -> int:
        start = time.time()
        time.sleep(0.3)
        spans.append((start, time.time(), self.request.retries))
        return n

    worker(app, concurrency=4)
    results = [call.delay(n) for n in range(10)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(10))
    assert len(spans) == 10 and all(retries == 0 for _, _, retries in spans)
    assert _windows([start for start, _, _ in spans], 1.0 - WAY) <= 4  # the rate: charged once each
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 2  # the concurrency limit


def test_a_run_admitted_by_the_rate_but_refused_a_permit_is_not_lost(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    """Runs parked for the rate come back while the concurrency limit is full (runs
    longer than the rate's spacing): refused a permit, each parks for it and runs
    once it is free -- none is held back until its claim lapses (#25)."""
    spans: list[tuple[float, float, int]] = []

    @rate_limited_task(
        app=app, global_rate_limit="4/s", concurrency_limit=1, concurrency_key="api1", bind=True
    )
    def call(self: Any, n: int) -> int:
        start = time.time()
        time.sleep(0.3)
        spans.append((start, time.time(), self.request.retries))
        return n

    worker(app, concurrency=4)
    results = [call.delay(n) for n in range(8)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(8))
    assert len(spans) == 8 and all(retries == 0 for _, _, retries in spans)
    assert _windows([start for start, _, _ in spans], 1.0 - WAY) <= 4
    ordered = sorted(spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))  # one at once


def _one_at_once_two_per_2s(
    app: Celery, locks: redis.Redis, prefix: str, n: int, hold: float, **options: Any
) -> tuple[Any, list[tuple[int, float]], list[tuple[float, float, int]], RedisRateLimiter]:
    """The combined case of the tests below (#25): a task of at most 1 at once (pool
    ``one<n>``) and 2 per 2 s (limiter ``api<n>``, spent already), under a prefix of
    its own (no earlier test's pump publishes its runs). Its body records
    ``(argument, start)`` as it starts and ``(start, end, retries)`` once it held
    ``hold`` s. Returns the task, those two lists and the limiter."""
    app.conf.redislock_prefix = prefix
    started: list[tuple[int, float]] = []
    spans: list[tuple[float, float, int]] = []

    @rate_limited_task(
        app=app,
        global_rate_limit="2/2s",
        global_rate_key=f"api{n}",
        concurrency_limit=1,
        concurrency_key=f"one{n}",
        bind=True,
        **options,
    )
    def call(self: Any, k: int) -> int:
        start = time.time()
        started.append((k, start))
        time.sleep(hold)
        spans.append((start, time.time(), self.request.retries))
        return k

    limiter = RedisRateLimiter(locks, f"api{n}", rate="2/2s", prefix=prefix)
    assert limiter.acquire(blocking=False) and limiter.acquire(blocking=False)  # spent
    return call, started, spans, limiter


def test_a_run_the_rate_admitted_waits_for_its_permit_without_a_charge(
    app: Celery, locks: redis.Redis, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """At most 1 at once and 2 per 2 s: two runs parked for the rate are claimed
    together; one takes the permit, the other parks for the permit -- its rate charge
    refunded, so only a run that really started counts (before, the waiting one kept
    its charge: the limiter's other callers were held back by an admission nobody
    used). A run refused a permit parks at intake, no pool process (#25)."""
    call, started, spans, limiter = _one_at_once_two_per_2s(app, locks, "combined", 2, 1.0)
    caplog.set_level(logging.DEBUG, logger="celery_redislock.celery.bounded.parking")
    worker(app, concurrency=4)
    results = [call.delay(n) for n in range(2)]  # parked for the rate, claimed together
    deadline = time.time() + 5
    while not started and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the other one was refused the permit meanwhile
    assert started and not spans
    assert [u.used for u in limiter.info().active] == [1]  # the run that started, only
    assert limiter.acquire(blocking=False)  # the admission the waiting run left
    late = call.delay(2)  # refused a permit (the limit is full): parked at intake
    assert sorted(r.get(timeout=30) for r in [*results, late]) == [0, 1, 2]
    assert all(retries == 0 for _, _, retries in spans)
    ordered = sorted(spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))  # one at once
    assert _windows([start for start, _, _ in spans], 2.0 - WAY) <= 2
    parked_at = [r.getMessage() for r in caplog.records if late.id in r.getMessage()]
    assert any("on intake" in line for line in parked_at), parked_at


def test_a_run_the_rate_admitted_rescheduled_for_its_permit_gives_its_admission_back(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    """As above with ``concurrency_park=False``: the run refused a permit is re-sent
    with a countdown instead of parked, and gives its admission back the same way (its
    claim dropped, its charge refunded), so only a run that really started counts.
    Before, the re-sent copy kept its rate token and its claim stayed charged (#25)."""
    limited = capture(rate_limited)
    call, started, spans, limiter = _one_at_once_two_per_2s(
        app, locks, "resent", 3, 1.0, concurrency_park=False, concurrency_countdown=0.2
    )
    worker(app, concurrency=4)
    results = []
    for n in range(2):  # one after the other: each parks for the rate, none re-sent
        results.append(call.delay(n))
        deadline = time.time() + 5
        while len(limited) <= n and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # its permit given back
    assert len(limited) == 2 and not started
    deadline = time.time() + 5  # claimed together at the admission time
    while not started and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the other one was refused the permit and re-sent meanwhile
    assert started and not spans
    assert [u.used for u in limiter.info().active] == [1]  # the run that started, only
    assert sorted(r.get(timeout=30) for r in results) == [0, 1]
    assert all(retries == 0 for _, _, retries in spans)
    ordered = sorted(spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))  # one at once
    assert _windows([start for start, _, _ in spans], 2.0 - WAY) <= 2


def test_a_run_that_left_the_rate_queue_before_an_outage_is_admitted_afresh(
    app: Celery,
    locks: redis.Redis,
    worker: Any,
    capture: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, and the reply of the drop is lost (the lock Redis unreachable right
    after it ran): the run waits for Redis and tries its guards again; by then the
    permit is free. Its rate token was consumed by the drop, so it is admitted afresh,
    not skipped as a second message of its own parked run (before: it was, and the run
    was lost)."""
    dropped: list[str] = []
    drop = ParkingQueue.drop

    def drop_then_lose_the_reply(self: ParkingQueue, entry_id: str) -> bool:
        done = drop(self, entry_id)
        if not dropped:
            dropped.append(entry_id)
            raise redis.ConnectionError("the reply was lost (test)")
        return done

    monkeypatch.setattr(ParkingQueue, "drop", drop_then_lose_the_reply)
    duplicates = capture(rate_duplicate)
    resent = capture(permit_rescheduled)
    # Held 0.15 s: over before the other run's first try again (0.25 s); a copy re-sent
    # (countdown 5 s) would come back after the test's wait.
    call, started, _, _ = _one_at_once_two_per_2s(
        app, locks, "resent-outage", 4, 0.15, concurrency_park=False, concurrency_countdown=5.0
    )
    worker(app, concurrency=4)
    results = []
    for n in range(2):  # one after the other: each parks for the rate, none re-sent
        results.append(call.delay(n))
        time.sleep(0.5)
    assert not started
    deadline = time.time() + 4
    while len(started) < 2 and not duplicates and time.time() < deadline:
        time.sleep(0.02)
    assert not duplicates, "skipped as a second message of its own parked run"
    assert sorted(r.get(timeout=4) for r in results) == [0, 1]  # not lost, not re-sent
    assert len(dropped) == 1 and len(started) == 2 and not resent


def test_a_run_whose_leave_never_reached_redis_runs_once(
    app: Celery,
    locks: redis.Redis,
    worker: Any,
    capture: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but the drop never reached the lock Redis (its connection failed
    before the call went out): the run's rate claim is still there, charged and
    claimed. When the run tries its guards again it must take that claim, not a fresh
    admission -- else the claim lapses (after ``redislock_lock_ttl``), is published
    again and the task runs a second time (79fcd2a admitted every run that had tried to
    leave afresh: 3 starts of 2 runs)."""
    app.conf.redislock_lock_ttl = 1.0  # a claim left behind lapses within the test
    failed: list[str] = []
    drop = ParkingQueue.drop

    def drop_never_sent(self: ParkingQueue, entry_id: str) -> bool:
        if not failed:
            failed.append(entry_id)
            raise redis.ConnectionError("the call never went out (test)")
        return drop(self, entry_id)

    monkeypatch.setattr(ParkingQueue, "drop", drop_never_sent)
    duplicates = capture(rate_duplicate)
    call, started, _, _ = _one_at_once_two_per_2s(
        app, locks, "resent-unsent", 5, 0.15, concurrency_park=False, concurrency_countdown=5.0
    )
    worker(app, concurrency=4)
    results = []
    for n in range(2):
        results.append(call.delay(n))
        time.sleep(0.5)
    assert sorted(r.get(timeout=6) for r in results) == [0, 1]
    time.sleep(4.0)  # a claim left behind lapses (1 s), is claimed at the rate and runs
    assert len(failed) == 1 and not duplicates
    assert sorted(n for n, _ in started) == [0, 1], "a run started twice"


@pytest.mark.parametrize("park", [False, True], ids=["re-sent", "parked"])
def test_a_second_message_refused_a_permit_is_not_re_sent_to_run_again(
    app: Celery,
    locks: redis.Redis,
    worker: Any,
    capture: Any,
    monkeypatch: pytest.MonkeyPatch,
    park: bool,
) -> None:
    """A run the rate admitted, refused a permit, leaves the rate queue by dropping its
    token; when that token was consumed already (another message of the same parked
    run, published again after its claim lapsed, took it and runs) this message is
    skipped as a duplicate. Before, the drop's False was ignored: the copy was re-sent
    without the rate header, admitted afresh, and the task ran twice. The other
    message's take is simulated right before the drop."""
    taken_by_other: list[str] = []
    drop = ParkingQueue.drop

    def taken_first(self: ParkingQueue, entry_id: str) -> bool:
        if not taken_by_other:
            taken_by_other.append(entry_id)
            status, _ = self.take(entry_id, "another-message@test")
            assert status == "granted", status
        return drop(self, entry_id)

    monkeypatch.setattr(ParkingQueue, "drop", taken_first)
    duplicates = capture(rate_duplicate)
    resent = capture(permit_rescheduled)
    call, started, _, _ = _one_at_once_two_per_2s(
        app, locks, f"consumed-{park}", 6, 0.15, concurrency_park=park, concurrency_countdown=0.3
    )
    worker(app, concurrency=4)
    for n in range(2):
        call.delay(n)
        time.sleep(0.5)
    time.sleep(5.0)
    assert len(taken_by_other) == 1
    # The refused message's token was taken by "another message" (which runs it): this
    # message must not run too.
    assert len(started) == 1, started
    assert len(duplicates) == 1 and not resent


def test_a_body_that_starts_late_after_its_take_is_charged_from_its_start(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    """A run's take charges its limiter from the take plus a 10 ms margin (the rest of
    before_start); a body that starts later (here a before_start of 500 ms after the
    guards; a process descheduled between the take's reply and its body on a loaded
    machine) has its charge moved to its real start, so no later run is admitted
    within a period of it. Before, its one charge ended a period after the take: 21 starts of
    N=20 in a 1 s window in the backlog benchmark at load 4-5 (#25)."""
    app.conf.redislock_prefix = "late"  # no earlier test's pump publishes these

    class SlowStart(RedisLockTask):  # type: ignore[type-arg]
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            super().before_start(task_id, args, kwargs)
            time.sleep(0.5)

    @app.task(base=SlowStart, global_rate_limit="5/10s", global_rate_key="slow", shared=False)
    def call(n: int) -> int:
        return n

    limiter = RedisRateLimiter(locks, "slow", rate="5/10s", prefix="late")
    worker(app, concurrency=2)
    assert call.delay(1).get(timeout=10) == 1
    info = limiter.info()
    (usage,) = info.active
    assert usage.used == 1, usage  # one run, one charge: moved, not added
    # It counts from after the body's start (500 ms after the take): the next
    # admission a whole period after that, not after the take (9.5 s from now).
    spent = RedisRateLimiter(locks, "slow", rate="1/10s", prefix="late")  # same log
    assert not spent.acquire(blocking=False)
    assert 9.75 < spent.retry_after() <= 10.05, spent.retry_after()


def test_a_singleton_with_a_rate_runs_each_signature_once_at_the_rate(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    runs: list[tuple[float, int, int]] = []

    @rate_limited_task(app=app, global_rate_limit="2/s", singleton=True, bind=True)
    def call(self: Any, n: int) -> int:
        runs.append((time.time(), n, self.request.retries))
        return n

    worker(app, concurrency=4)
    results = [call.delay(n) for n in range(5)]
    assert call.delay(4).id == results[4].id  # a duplicate of a queued call: that call
    assert [r.get(timeout=20) for r in results] == list(range(5))
    assert sorted(n for _, n, _ in runs) == list(range(5))  # each once
    assert all(retries == 0 for _, _, retries in runs)
    assert _windows([at for at, _, _ in runs], 1.0 - WAY) <= 2


def test_celerys_own_rate_limit_still_works_beside(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    starts: list[float] = []

    @rate_limited_task(app=app, global_rate_limit="100/s", rate_limit="2/s")
    def call(n: int) -> int:
        starts.append(time.time())
        return n

    worker(app, concurrency=2)
    results = [call.delay(n) for n in range(5)]
    assert sorted(r.get(timeout=20) for r in results) == list(range(5))
    assert max(starts) - min(starts) >= 1.4  # Celery's token bucket: 2 a second here


def test_runs_sent_past_apply_async_are_parked_at_the_workers_intake(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any
) -> None:
    limited = capture(rate_limited)
    runs: list[tuple[float, str, int]] = []

    @rate_limited_task(app=app, global_rate_limit="3/s", bind=True)
    def call(self: Any, n: int) -> int:
        runs.append((time.time(), self.request.id, self.request.retries))
        return n

    worker(app, concurrency=2)
    # send_task publishes as is: the worker's main process admits or parks each run.
    results = [app.send_task(call.name, (n,)) for n in range(7)]
    assert sorted(r.get(timeout=20) for r in results) == list(range(7))
    assert len({task_id for _, task_id, _ in runs}) == 7 == len(runs)
    assert all(retries == 0 for _, _, retries in runs)
    assert _windows([at for at, _, _ in runs], 1.0 - WAY) <= 3
    assert len(limited) == 4


def test_a_parked_run_whose_claim_is_published_twice_runs_once(
    app: Celery, locks: redis.Redis, worker: Any, capture: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two messages of one park token (a claim published again: by a park re-sent or
    recovered after the lock Redis restarted, which hands back the entries it claimed
    that are still claimed): the second finds its token consumed and is skipped. It ran
    too while the guard's take sent the task id as its owner -- the owner of a re-sent
    take, whose consumed token answers as the first take did (#25, the outage test's
    two runs twice). Each skipped message sends ``rate_duplicate``, as a pool's
    ``permit_duplicate``."""
    # A prefix of its own, apart from other tests' pools. (It was needed while the pumps
    # of earlier tests' in-process workers outlived them; they stop with their worker
    # now, tests/integration/test_background.py.)
    app.conf.redislock_prefix = "twice"
    runs: list[str] = []

    @rate_limited_task(app=app, global_rate_limit="4/s", global_rate_key="twice", bind=True)
    def call(self: Any, n: int) -> int:
        runs.append(self.request.id)
        return n

    published = parking.publish_claimed  # what each queue's on_claimed calls (87f8740)

    def twice(app_: Celery, queue: Any, claimed: Any) -> None:
        published(app_, queue, claimed)
        published(app_, queue, claimed)

    monkeypatch.setattr(parking, "publish_claimed", twice)
    skipped = capture(rate_duplicate)
    worker(app, concurrency=2)
    results = [call.delay(n) for n in range(8)]  # 4 admitted, 4 parked and pumped
    assert [r.get(timeout=20) for r in results] == list(range(8))
    time.sleep(1.0)  # the second messages have come
    counts = Counter(runs)
    assert sorted(counts) == sorted(r.id for r in results)
    assert max(counts.values()) == 1, counts
    assert len(skipped) == 4 and {s["key"] for s in skipped} == {"twice"}
    assert {s["task_id"] for s in skipped} <= {r.id for r in results}
