"""bounded/redelivery.py's second_message on a real redis-server: a broker's redelivery
of a parked run whose first run died runs, whatever the first run's permit lasts."""

from __future__ import annotations

from types import SimpleNamespace

import redis
from celery import Celery

from celery_redislock.celery.bounded.redelivery import second_message
from celery_redislock.core.parking import DUPLICATE, TAKEN, ParkingSemaphore, new_entry_id


class _Task:
    """The few attributes of a bound task second_message reads (a hashable sender)."""

    name = "proj.work"

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.request = SimpleNamespace(delivery_info={"redelivered": True})


def test_a_dead_run_with_a_per_call_lock_ttl_longer_than_the_tasks_is_run_by_its_copy(
    r: redis.Redis,
) -> None:
    # The call asked for lock_ttl=2 (apply_async(lock_ttl=...)), the task's is 1 (it
    # capped the wait before the fix): the first run's permit lasts 2 s. Its worker
    # died (no renewal). The copy must look again once that permit would have lapsed
    # unrenewed -- not after the task's 1 s, when the dead permit is still there and
    # would be taken for a live run's.
    app = Celery("second-message", broker="memory://", set_as_current=False)
    sem = ParkingSemaphore(r, "api", limit=1, ttl=2)
    entry_id = new_entry_id()
    assert sem.park(entry_id, b"run", owner="t1") == 0
    status, first = sem.take(entry_id, "t1@first", ttl=2, renew=False)  # then it died
    assert status == TAKEN and first is not None
    assert sem.take(entry_id, "t1@copy")[0] == DUPLICATE
    task = _Task(app)
    lease = second_message(
        task,  # type: ignore[arg-type]
        SimpleNamespace(task_id="t1"),  # type: ignore[arg-type]
        sem,
        entry_id,
        "t1@copy",
        ttl=2,
        on_lost=lambda _: None,
    )
    assert lease is not None and lease.token == entry_id  # the copy is the run now
    assert lease.release()
