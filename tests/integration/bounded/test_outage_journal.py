"""The park journal: parked runs kept in the broker's Redis too, parked again by a
sweeper when the lock Redis (a server of its own) comes back without its data.

In-process: the parks are made as ``park_run`` makes them (journal, then lock Redis);
the sweeper's ticks are called directly. Also: a restart that kept part of the data,
the journal's own Redis down, and a parked singleton whose handed lease lapsed (as a
restart without data makes it). The workers' side is in test_outage.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import bounded_task
from celery_redislock.celery.bounded.journal import forget, journal_for, record
from celery_redislock.celery.bounded.parking import encode_message, parking_for, semaphore_spec
from celery_redislock.celery.bounded.sweeper import Sweeper
from celery_redislock.celery.singleton.signature import call_key
from celery_redislock.core.parking import ParkingSemaphore, new_entry_id
from celery_redislock.testing import RedisServer

from ..conftest import MakeApp
from ..helpers import lock_info, wait_until
from ..workers import BROKER_DB, db_url
from .helpers import busy_and_parking_singleton


@pytest.fixture
def lock_server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


def _app(make_app: MakeApp, lock_server: RedisServer) -> tuple[Celery, Any, str]:
    prefix = f"j{uuid.uuid4().hex[:8]}"
    # No restart grace: it would hold the permits for the TTL (30 s) after a restart
    # (see test_restart_grace.py); these tests look at the journal's recovery alone.
    app = make_app(
        redislock_url=lock_server.url,
        redislock_prefix=prefix,
        redislock_client_options={"socket_timeout": 2},
        redislock_restart_grace=False,
    )

    @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
    def call(n: int) -> int:  # pragma: no cover - never runs here
        return n

    return app, call, prefix


def _park(app: Celery, task: Any, sem: ParkingSemaphore, n: int) -> str:
    """Park a run of ``task(n)`` as park_run does: journal first, then the lock Redis."""
    entry_id = new_entry_id()
    options = {"task_id": f"run-{n}", "headers": {"redislock_park": f"{entry_id} 0 0"}}
    payload = encode_message(task, (n,), {}, options)
    record(app, entry_id, payload, spec=semaphore_spec(sem, sem.limit), owner=f"run-{n}")
    sem.park(entry_id, payload, owner=f"run-{n}")
    return entry_id


def test_runs_parked_when_the_lock_redis_restarts_empty_are_parked_again(
    make_app: MakeApp, lock_server: RedisServer, redis_url: str
) -> None:
    app, call, prefix = _app(make_app, lock_server)
    journal = journal_for(app)
    assert (
        journal is not None and journal.client.connection_pool.connection_kwargs["db"] == BROKER_DB
    )  # the broker's Redis: another server than the locks'
    sem = parking_for(app, "api", 1, 30.0, prefix)
    holder = sem.acquire(blocking=False)  # the permit's run; nothing is claimed
    assert holder is not None
    ids = [_park(app, call, sem, n) for n in range(5)]
    assert [i for i, _ in journal.entries()] == ids
    sweeper = Sweeper(app, 1.0)
    sweeper.tick()  # learns the lock Redis's mark: nothing to recover
    assert sem.parking_info().parked == 5
    # Runs 0 and 1 start just before the restart (their messages were published):
    # each drops its journal entry before it consumes its token.
    for entry_id in ids[:2]:
        forget(app, entry_id)
        sem.take(entry_id, "owner")
    lock_server.restart()  # empty
    sweeper.tick()  # parks runs 2, 3, 4 again, oldest first: 2 is claimed at once
    info = sem.parking_info(count=10)
    assert info.claimed == 1 and [owner for _, _, owner in info.head] == ["run-3", "run-4"]
    assert sorted(i for i, _ in journal.entries()) == sorted(ids[2:])
    # A second sweeper (another worker) finds the recovery done.
    Sweeper(app, 1.0).tick()
    assert sem.parking_info().parked == 2
    # The claimed run starts: its token is the one it was parked under; a second
    # message of it (published before the restart) is a duplicate.
    forget(app, ids[2])
    status, lease = sem.take(ids[2], "owner-2")
    assert status == "granted" and lease is not None
    forget(app, ids[2])
    assert sem.take(ids[2], "owner-x")[0] == "duplicate"
    assert sorted(i for i, _ in journal.entries()) == sorted(ids[3:])
    lease.release()  # claims run 3
    redis.Redis.from_url(db_url(redis_url, BROKER_DB)).delete(f"q-{app.main}")


def test_a_run_resumed_before_the_restart_is_not_parked_again(
    make_app: MakeApp, lock_server: RedisServer
) -> None:
    app, call, prefix = _app(make_app, lock_server)
    sem = parking_for(app, "api", 1, 30.0, prefix)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    entry_id = _park(app, call, sem, 0)
    Sweeper(app, 1.0).tick()
    lock_server.restart()
    # Its message starts in the new lock Redis before any sweeper recovered: the
    # token is unknown there, and the run takes a free permit (it is not a duplicate).
    forget(app, entry_id)
    status, lease = sem.take(entry_id, "owner")
    assert status == "granted" and lease is not None
    Sweeper(app, 1.0).tick()  # nothing journaled: nothing parked again
    assert sem.parking_info().parked == 0 and sem.parking_info().claimed == 0


def test_no_journal_when_the_broker_is_the_lock_redis(make_app: MakeApp, redis_url: str) -> None:
    assert journal_for(make_app()) is None  # broker db 1, locks db 3: one server
    app = make_app(redislock_park_journal_url=False, redislock_url="redis://127.0.0.1:1/0")
    assert journal_for(app) is None
    explicit = make_app(redislock_park_journal_url=db_url(redis_url, BROKER_DB))
    assert journal_for(explicit) is not None
    assert isinstance(journal_for(explicit).client, redis.Redis)  # type: ignore[union-attr]


def test_a_parked_singleton_whose_handed_lease_lapsed_still_runs(
    app: Celery, locks: redis.Redis, worker: Any
) -> None:
    # Mode until_and_while_executing: a parked run names the running lease it was
    # handed. If that lease lapsed while parked (lock_queued_ttl, or a lock Redis that
    # came back empty and recovered the run from the journal), the run takes the free
    # lock afresh -- and was then skipped as "stale" when a newer call held the queued
    # lock, read as though this run's token had been the queued lock's.
    proceed, first_busy, sync = busy_and_parking_singleton(app, locks, worker, lock_queued_ttl=1)
    first = sync.delay(7)
    key = call_key(sync, (7,), {}, {})
    sem = ParkingSemaphore(locks, "api", limit=1)
    wait_until(lambda: sem.parking_info().parked == 1, what="the singleton parked")
    wait_until(lambda: not lock_info(locks, key).held, timeout=5, what="its handed lease lapsed")
    newer = sync.apply_async((7,), countdown=4)  # holds the queued lock meanwhile
    proceed.set()
    assert first_busy.get(timeout=10) == "busy"
    assert first.get(timeout=10) == 7  # was skipped: PENDING for ever
    assert newer.get(timeout=15) == 7


def test_the_journal_redis_down_neither_blocks_parking_nor_forgets_a_drop(
    make_app: MakeApp, lock_server: RedisServer, caplog: Any
) -> None:
    with RedisServer() as journal_server:
        app = make_app(
            redislock_url=lock_server.url,
            redislock_prefix="jdown",
            redislock_park_journal_url=journal_server.url,
            redislock_client_options={
                "socket_connect_timeout": 0.5,
                "retry": Retry(NoBackoff(), 0),
            },
        )

        @bounded_task(app=app, concurrency_limit=1, concurrency_key="api")
        def call(n: int) -> int:  # pragma: no cover - never runs here
            return n

        journal = journal_for(app)
        assert journal is not None
        sem = parking_for(app, "api", 1, 30.0, "jdown")
        assert sem.acquire(blocking=False) is not None
        kept = _park(app, call, sem, 0)
        journal_server.kill()
        caplog.set_level(logging.WARNING, logger="celery_redislock")
        _park(app, call, sem, 1)  # parks without the journal
        forget(app, kept)  # its run starts: the drop waits for the journal's Redis
        Sweeper(app, 1.0).tick()  # cannot read the journal: sweeps all the same
        assert sem.parking_info().parked == 2
        assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 2
        assert [r for r in caplog.records if "journal cannot be read" in r.getMessage()]
        journal_server.start()  # empty here; the kept drop is sent before the next call
        journal.put(kept, b"x", 60.0)  # as if the data had survived
        _park(app, call, sem, 2)
        assert [entry_id for entry_id, _ in journal.entries()] != [] and kept not in dict(
            journal.entries()
        )


def test_a_restart_that_kept_part_of_the_data_gets_the_rest_back(
    make_app: MakeApp, lock_server: RedisServer
) -> None:
    # A snapshot (or a lagging replica promoted) without the newest park: the mark is
    # kept, but the server's run_id is new, so the journal is offered again.
    app, call, prefix = _app(make_app, lock_server)
    sem = parking_for(app, "api", 1, 30.0, prefix)
    assert sem.acquire(blocking=False) is not None
    ids = [_park(app, call, sem, n) for n in range(2)]
    Sweeper(app, 1.0).tick()
    locks = redis.Redis(port=lock_server.port)
    locks.save()  # the snapshot holds runs 0 and 1
    ids.append(_park(app, call, sem, 2))
    assert lock_server.process is not None
    lock_server.kill()
    lock_server.start()  # loads the snapshot: run 2 is missing
    assert sem.parking_info().parked == 2
    Sweeper(app, 1.0).tick()
    info = sem.parking_info(count=10)
    assert [owner for _, _, owner in info.head] == ["run-0", "run-1", "run-2"]


def test_a_restart_that_kept_the_data_publishes_no_claimed_run_again(
    make_app: MakeApp, lock_server: RedisServer, redis_url: str
) -> None:
    # Run 0, parked while the permit was free, is claimed and published at once; its
    # message is on its way (not started) when the lock Redis restarts from a snapshot
    # that holds it (run 1, parked after the snapshot, is lost). Recovery offers the
    # journal again (new run_id): run 1 is parked again; run 0 is known, so its park
    # would change nothing -- but it answered what run 0's first park claimed, and run
    # 0 was published a second time (two messages of one token, one skipped).
    app, call, prefix = _app(make_app, lock_server)
    broker = redis.Redis.from_url(db_url(redis_url, BROKER_DB))
    queue = f"q-{app.main}"
    sem = parking_for(app, "api", 1, 30.0, prefix)
    Sweeper(app, 1.0).tick()  # learns the lock Redis's mark
    ids = [_park(app, call, sem, 0)]
    assert sem.parking_info().claimed == 1 and broker.llen(queue) == 1
    redis.Redis(port=lock_server.port).save()
    ids.append(_park(app, call, sem, 1))
    lock_server.kill()
    lock_server.start()  # from the snapshot: run 0 still claimed, run 1 missing
    assert sem.parking_info().parked == 0
    Sweeper(app, 1.0).tick()
    info = sem.parking_info(count=10)
    assert info.claimed == 1 and [owner for _, _, owner in info.head] == ["run-1"]
    assert sorted(i for i, _ in journal_for(app).entries()) == sorted(ids)  # type: ignore[union-attr]
    assert broker.llen(queue) == 1, "the claimed run 0 published again"
    broker.delete(queue)
