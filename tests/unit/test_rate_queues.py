"""A rate-limited pool's queue is made once and kept, while every setting it is made
of is read again each time (#25: making it was a third of the rate guard's CPU)."""

from __future__ import annotations

from celery import Celery

from celery_redislock.celery.ratelimit.queues import rate_queue


def test_a_queue_is_kept_until_a_setting_it_is_made_of_changes() -> None:
    app = Celery("rate-queues", set_as_current=False)
    app.conf.update(redislock_url="redis://127.0.0.1:1/0")  # never connected to here
    first = rate_queue(app, "api", ("10/s",))
    assert rate_queue(app, "api", ("10/s",)) is first
    assert rate_queue(app, "api", ("5/s",)) is not first  # other rates: another limiter view
    assert rate_queue(app, "other", ("10/s",)) is not first
    app.conf.redislock_park_keep = 60.0  # counts from the next run on
    changed = rate_queue(app, "api", ("10/s",))
    assert changed is not first and changed._keep_ms == 60_000
    app.conf.redislock_prefix = "elsewhere"
    assert rate_queue(app, "api", ("10/s",)).capacity.prefix == "elsewhere"
