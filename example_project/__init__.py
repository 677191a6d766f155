"""A runnable Celery project showing what ``celery_redislock`` is for.

Three tasks that must not run "too much at once", on two real worker processes and
``celery beat``:

* ``nightly_report`` -- a ``@singleton_task`` that beat fires every second although
  a run takes 2.5 s: the extra ticks are refused, never run beside the running one;
* ``sync_user(user_id)`` -- a ``@singleton_task`` that a burst of requests enqueues
  60 times for 5 users: one run per user at a time, the repeat calls get the
  ``AsyncResult`` of the copy already queued or running;
* ``call_partner_api(n)`` -- a ``@bounded_task`` capped at 3 concurrent calls across
  both workers (6 pool processes).

Run it all with one command, from the repository root::

    python -m example_project            # embedded Redis, or $REDIS_URL when set

The tasks are in :mod:`example_project.app`; the driver (:mod:`.__main__`) starts the
processes (:mod:`.processes`), drives the scenarios (:mod:`.scenarios`) and prints
the report (:mod:`.report`).
"""
