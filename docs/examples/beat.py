"""Beat on several hosts: one leads and sends, each scheduled run at most once.

Shown in docs/guides/beat.md and the README; run by tests/integration/test_docs_examples.py
(which checks the configuration names a real scheduler; tests/integration/beat runs beats).
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("proj", broker=os.environ["REDIS_URL"])

# --8<-- [start:config]
app.conf.beat_scheduler = "celery_redislock.beat:LeaderScheduler"  # or: celery beat -S ...
app.conf.redislock_beat_scheduler = "celery.beat:PersistentScheduler"  # the one it guards
app.conf.redislock_beat_lease = 10.0  # seconds: a dead leader is replaced within one lease
app.conf.beat_schedule = {
    "nightly-report": {"task": "proj.nightly_report", "schedule": 60.0},
}
# --8<-- [end:config]


def main() -> None:
    from celery.beat import Scheduler
    from celery.utils.imports import symbol_by_name

    scheduler = symbol_by_name(app.conf.beat_scheduler)
    assert issubclass(scheduler, Scheduler)
    assert issubclass(symbol_by_name(app.conf.redislock_beat_scheduler), Scheduler)
    # --8<-- [start:django]
    app.conf.redislock_beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
    # --8<-- [end:django]
    assert app.conf.redislock_beat_scheduler.startswith("django_celery_beat.")


if __name__ == "__main__":
    main()
