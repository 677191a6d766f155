"""Events counted in the lock Redis by real workers (#27): singleton grants, duplicates
refused at enqueue, releases with their hold times; bounded runs granted, parked and
handed off; what the exporter's collector then shows."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_redislock import RateLimited, RedisLockTask, bounded_task, singleton_task
from celery_redislock.celery.beat.signals import beat_elected, beat_slot_sent, beat_slot_skipped
from celery_redislock.celery.client import get_redis
from celery_redislock.celery.metrics import flush, record
from celery_redislock.celery.metrics import recorder as recorder_module
from celery_redislock.celery.metrics.collector import RedisLockCollector
from celery_redislock.celery.metrics.read import CounterSet, read_counters, read_state
from celery_redislock.celery.metrics.recorder import recorder_for
from celery_redislock.core import release_all

from ..conftest import MakeApp
from ..helpers import wait_until


def _counts(locks: redis.Redis, kind: str, name: str) -> CounterSet | None:
    found = [c for c in read_counters(locks, "redislock") if (c.kind, c.name) == (kind, name)]
    return found[0] if found else None


def _flush(app: Celery) -> bool:
    """Send what this process counted for ``app`` (not every app's: a recorder of an
    earlier test whose Redis is gone would take the whole timeout)."""
    return recorder_for(get_redis(app)).flush(10)


def _settled(locks: redis.Redis, kind: str, name: str, expected: dict[str, int]) -> CounterSet:
    """The counters once they equal ``expected`` (the workers' threads send them soon)."""

    def equal() -> CounterSet | None:
        found = _counts(locks, kind, name)
        return found if found is not None and found.counts == expected else None

    try:
        return wait_until(equal, 20, f"{kind} {name} counters {expected}")  # type: ignore[no-any-return]
    except AssertionError:
        found = _counts(locks, kind, name)
        raise AssertionError(f"{kind} {name}: {found and found.counts} != {expected}") from None


def test_on_by_default(app: Celery, locks: redis.Redis, worker: Any) -> None:
    @singleton_task(app=app)
    def job(n: int) -> int:
        return n

    worker(app)
    assert job.delay(1).get(timeout=30) == 1
    _settled(locks, "lock", job.name, {"granted": 1, "released": 1})


def test_switched_off_and_on_again(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    """``redislock_metrics = False`` counts nothing; the setting is read again when it
    changes (the receivers keep what they made of it until then)."""
    app = make_app(redislock_metrics=False)

    @singleton_task(app=app)
    def job(n: int) -> int:
        return n

    worker(app)
    assert job.delay(1).get(timeout=30) == 1
    assert _flush(app)
    assert read_counters(locks, "redislock") == []
    app.conf.redislock_metrics = True
    assert job.delay(2).get(timeout=30) == 2
    _settled(locks, "lock", job.name, {"granted": 1, "released": 1})
    app.conf.redislock_metrics = False
    assert job.delay(3).get(timeout=30) == 3
    assert _flush(app)  # the worker runs in this process: what it counted is in Redis now
    got = _counts(locks, "lock", job.name)
    assert got is not None and got.counts == {"granted": 1, "released": 1}


def test_a_bad_setting_is_logged_and_counts_nothing(
    make_app: MakeApp, locks: redis.Redis, worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(redislock_metrics="yes")

    @singleton_task(app=app)
    def job(n: int) -> int:
        return n

    worker(app)
    with caplog.at_level(logging.ERROR, logger="celery_redislock.metrics"):
        assert [job.delay(n).get(timeout=30) for n in range(3)] == [0, 1, 2]
    assert _flush(app)
    assert read_counters(locks, "redislock") == []
    errors = [r.getMessage() for r in caplog.records if r.name == "celery_redislock.metrics"]
    assert len(errors) == 1 and "redislock_metrics" in errors[0] and "'yes'" in errors[0]


def test_singleton_counts_and_hold_time(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    app = make_app(redislock_metrics=True)
    proceed = threading.Event()

    @singleton_task(app=app)
    def job(n: int) -> int:
        proceed.wait(30)
        return n

    worker(app)
    first = job.delay(1)
    duplicates = [job.delay(1) for _ in range(3)]  # refused: the queued/running copy
    assert {d.id for d in duplicates} == {first.id}
    other = job.delay(2)
    time.sleep(0.2)
    proceed.set()
    assert first.get(timeout=30) == 1 and other.get(timeout=30) == 2
    got = _settled(locks, "lock", job.name, {"granted": 2, "refused_duplicate": 3, "released": 2})
    assert got.hold is not None and got.hold.count == 2
    assert got.hold.sum >= 0.2  # both runs waited for `proceed`, set after 0.2 s
    assert got.wait is None


def test_bounded_parked_and_handed_off(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    app = make_app(redislock_metrics=True)
    proceed = threading.Event()
    started: list[int] = []

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api", concurrency_wait=0)
    def call(n: int) -> int:
        started.append(n)
        if n == 0:
            proceed.wait(30)
        return n

    worker(app, concurrency=3)
    first = call.delay(0)
    wait_until(lambda: started, 30, "the first run")
    rest = [call.delay(n) for n in (1, 2)]
    parked = lambda: (c := _counts(locks, "parking", "api")) and c.counts.get("parked") == 2  # noqa: E731
    wait_until(parked, 30, "two runs parked")
    time.sleep(0.2)
    proceed.set()
    assert [r.get(timeout=30) for r in (first, *rest)] == [0, 1, 2]
    # The first run's permit was reserved by the worker's intake as its message came
    # in (a permit was free): granted at once, not a hand-off -- only the two parked
    # runs were handed a permit by a release.
    sem = _settled(locks, "semaphore", "api", {"granted": 1, "handed_off": 2, "released": 3})
    _settled(locks, "parking", "api", {"parked": 2})
    assert sem.wait is not None and sem.wait.count == 3
    assert sem.wait.cumulative[0] >= 1  # the first: a wait of 0, in the first bucket
    assert sem.hold is not None and sem.hold.count == 3
    assert sem.wait.sum >= 0.2 * 2  # the parked two waited for the first to end

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisLockCollector(locks, "redislock"))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = (("kind", "semaphore"), ("name", "api"), ("outcome", "handed_off"))
    assert samples["celery_redislock_events_total", key] == 2
    labels = (("kind", "semaphore"), ("name", "api"))
    assert samples["celery_redislock_wait_seconds_count", labels] == 3
    assert ("celery_redislock_parked_runs", (("pool", "api"),)) not in samples  # all free
    assert samples["celery_redislock_up", ()] == 1


def test_callable_pool_counts_under_the_task(
    make_app: MakeApp, locks: redis.Redis, worker: Any
) -> None:
    """A callable concurrency_key may make a pool per tenant: its runs are counted
    under the task's name, so the series stay bounded."""
    app = make_app(redislock_metrics=True)

    @bounded_task(app=app, concurrency_limit=2, concurrency_key=lambda tenant: f"t-{tenant}")
    def call(tenant: int) -> int:
        return tenant

    worker(app)
    assert [call.delay(t).get(timeout=30) for t in range(5)] == list(range(5))
    # Each reserved at intake, one after the other: granted, never parked.
    _settled(locks, "semaphore", call.name, {"granted": 5, "released": 5})
    names = {c.name for c in read_counters(locks, "redislock")}
    assert names == {call.name}


def test_recorder_never_waits_and_sends_after_an_outage(fault_proxy: Any, r: redis.Redis) -> None:
    from celery_redislock.celery.metrics.recorder import Recorder

    client = fault_proxy.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    recorder = Recorder(client)
    fault_proxy.pause()
    started = time.perf_counter()
    for _ in range(100):
        recorder.add("redislock", "lock", "t", "granted", hold=0.5)
    assert time.perf_counter() - started < 0.5  # never waits for Redis
    assert recorder.flush(0.3) is False  # still pending
    fault_proxy.resume()
    assert recorder.flush(20) is True
    fields = r.hgetall("redislock:metrics:lock:{t}")
    assert int(fields[b"n:granted"]) == 100
    assert int(fields[b"hs"]) == 100 * 500_000


def test_a_recorder_keeps_neither_its_client_nor_its_thread(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting is on by default: a client made and dropped (a test's app, a setting
    changed) must not stay open for the process's life with a thread of its own."""
    monkeypatch.setattr(recorder_module, "_IDLE_CHECK", 0.2)
    client = redis.Redis.from_url(redis_url)
    gone = weakref.ref(client)
    record(client, "redislock", "lock", "dropped", "granted")
    assert recorder_for(client).flush(10)
    [thread] = [
        t
        for t in threading.enumerate()
        if t.name == "celery_redislock-metrics" and recorder_for(client)._thread is t
    ]
    del client
    gc.collect()
    assert gone() is None
    thread.join(5)
    assert not thread.is_alive()
    assert int(r.hget("redislock:metrics:lock:{dropped}", "n:granted") or 0) == 1


def test_flush_waits_its_timeout_once_whatever_is_down(fault_proxy: Any, r: redis.Redis) -> None:
    """At exit (atexit) and in flush(): one deadline for all the process's recorders
    (it was one each: an exit waited for every Redis that was down in turn), those
    whose Redis answers flushed first."""
    downs = [fault_proxy.client(socket_timeout=0.3, socket_connect_timeout=0.3) for _ in "abc"]
    up = redis.Redis(connection_pool=r.connection_pool)
    fault_proxy.pause()
    for down in downs:
        record(down, "redislock", "lock", "down", "granted")
    time.sleep(0.5)  # their first sends failed
    record(up, "redislock", "lock", "up", "granted")
    started = time.monotonic()
    assert flush(1.0) is False
    assert time.monotonic() - started < 2.0
    assert int(r.hget("redislock:metrics:lock:{up}", "n:granted") or 0) == 1
    fault_proxy.resume()
    assert all(recorder_for(down).flush(20) for down in downs)
    assert int(r.hget("redislock:metrics:lock:{down}", "n:granted") or 0) == 3


def test_lease_lost_counted(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    """A running singleton's lock released under it: its renewal reports it lost."""
    app = make_app(redislock_metrics=True)
    proceed = threading.Event()
    running = threading.Event()

    @singleton_task(app=app, lock_ttl=1)
    def job(n: int) -> int:
        running.set()
        proceed.wait(30)
        return n

    worker(app)
    result = job.delay(1)
    assert running.wait(30)
    assert release_all(locks, prefix="redislock", kind="lock") == 1
    try:
        _settled(locks, "lock", job.name, {"granted": 1, "lease_lost": 1})
    finally:
        proceed.set()
    result.get(timeout=30, propagate=False)


class _Sender:
    """What the receivers read of a beat scheduler: its app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def test_beat_events_counted(make_app: MakeApp, locks: redis.Redis) -> None:
    """Beat's signals, sent by its scheduler (``sender.app``), count under the entry
    or group name."""
    app = make_app(redislock_metrics=True)
    scheduler = _Sender(app)
    beat_elected.send(sender=scheduler, group="default", owner="host:1:x")
    for _ in range(3):
        beat_slot_sent.send(sender=scheduler, entry="nightly", slot=None)
    beat_slot_skipped.send(sender=scheduler, entry="nightly", slot=None, last=None)
    assert _flush(app)
    _settled(locks, "beat", "default", {"elected": 1})
    _settled(locks, "beat", "nightly", {"slot_sent": 3, "slot_skipped": 1})


def test_rate_limited_counted(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    app = make_app(redislock_metrics=True)
    ran: list[int] = []

    @app.task(base=RedisLockTask, global_rate_limit="2/m", global_rate_key="mailer")
    def send(n: int) -> int:
        ran.append(n)
        return n

    worker(app)
    for n in range(5):
        send.delay(n)
    wait_until(lambda: len(ran) == 2, 30, "the two runs the rate admits")
    # Two admitted at once; three parked for their admission (in a minute): each
    # counted once, by name.
    _settled(locks, "ratelimit", "mailer", {"granted": 2, "rate_limited": 3})
    assert len(ran) == 2
    state = read_state(locks, "redislock")
    [limiter] = [lim for lim in state.limiters if lim.name == "mailer"]
    assert limiter.parked == 3 and limiter.oldest_parked is not None
    assert 0 < limiter.next_admission <= 61


def test_penalty_counted(make_app: MakeApp, locks: redis.Redis, worker: Any) -> None:
    """A body's RateLimited (a 429) penalizes its limiter: counted once as penalized
    (and its run, parked again, once as rate_limited), under the limiter's name."""
    app = make_app(redislock_metrics=True)
    attempts: list[int] = []

    @app.task(base=RedisLockTask, global_rate_limit="100/s", global_rate_key="api")
    def call(n: int) -> int:
        attempts.append(n)
        if len(attempts) == 1:
            raise RateLimited("429 Too Many Requests", retry_after=0.2)
        return n

    worker(app)
    assert call.delay(1).get(timeout=30) == 1
    assert attempts == [1, 1]
    # Admitted at once, penalized, parked again, and admitted from the queue.
    counted = {"granted": 1, "penalized": 1, "rate_limited": 1, "handed_off": 1}
    _settled(locks, "ratelimit", "api", counted)


def test_a_parked_runs_admission_counted_as_handed_off_with_its_wait(
    make_app: MakeApp, locks: redis.Redis, worker: Any
) -> None:
    """Runs parked for the rate and started when the limiter's queue claims them are
    counted as a permit's parked runs are: ``handed_off``, with their wait; those
    admitted at once as ``granted``, with a wait of 0. Before, a parked run's
    admission sent no signal and was not counted (#27)."""
    app = make_app(redislock_metrics=True)
    ran: list[tuple[int, float]] = []

    @app.task(base=RedisLockTask, global_rate_limit="2/s", global_rate_key="pumped")
    def send(n: int) -> int:
        ran.append((n, time.time()))
        return n

    worker(app)
    sent = time.time()
    results = [send.delay(n) for n in range(4)]
    assert sorted(r.get(timeout=30) for r in results) == [0, 1, 2, 3]
    counted = {"granted": 2, "rate_limited": 2, "handed_off": 2}
    got = _settled(locks, "ratelimit", "pumped", counted)
    assert got.wait is not None and got.wait.count == 4
    assert got.wait.cumulative[0] >= 2  # the two admitted at once: a wait of 0
    late = sum(at - sent for _, at in sorted(ran, key=lambda r: r[1])[2:])
    assert 0.5 < got.wait.sum <= late + 0.1  # the parked two waited about a period


def test_events_of_a_client_gone_before_they_were_sent_are_said_dropped(
    redis_url: str, r: redis.Redis, caplog: Any
) -> None:
    """Events recorded while the thread let them gather, whose client then went away
    (its app closed), were dropped with no log line at all: the counts came out short,
    silently. Now one WARNING says how many (once: DEBUG after)."""
    from celery_redislock.celery.metrics.recorder import Recorder

    caplog.set_level(logging.DEBUG, logger="celery_redislock.metrics")
    client = redis.Redis.from_url(redis_url)
    gone = weakref.ref(client)
    recorder = Recorder(client, spacing=2.0)  # after a send, the next wait 2 s
    recorder.add("redislock", "lock", "t", "granted")  # sent at once
    key = "redislock:metrics:lock:{t}"
    wait_until(lambda: r.hget(key, "n:granted") is not None, 10, "the first send")
    for _ in range(5):  # gather during the spacing
        recorder.add("redislock", "lock", "t", "granted", hold=0.5)
    del client  # the thread holds it only while it sends
    wait_until(lambda: gc.collect() >= 0 and gone() is None, 10, "the client gone")
    assert recorder.flush(10) is True  # nothing pending: dropped
    recorder.add("redislock", "lock", "t", "granted")
    assert recorder.flush(10) is True
    assert int(r.hget(key, "n:granted") or 0) == 1
    dropped = [(rec.levelname, rec.getMessage()) for rec in caplog.records]
    dropped = [(level, text) for level, text in dropped if "dropped" in text]
    assert [level for level, _ in dropped] == ["WARNING", "DEBUG"], dropped
    assert "5 metrics event(s)" in dropped[0][1] and "1 metrics event(s)" in dropped[1][1]
