"""Global rate limits: at most N runs per period of a task (or of a pool several tasks
share) across every worker, by the lock Redis's clock (issue #25).

``options.py`` reads the task options ``global_rate_limit`` and ``global_rate_key``;
``queues.py`` makes a pool's limiter and its queue of parked runs (a
:class:`~celery_redislock.core.parking.ParkingQueue` of a
:class:`~celery_redislock.core.parking.RateCapacity`); ``guard.py`` admits a run when
it starts, or parks it, and handles :class:`~celery_redislock.errors.RateLimited`
from the body; ``pump.py`` is the thread of each worker's main process that starts
parked runs at their admission times. May import the core, the shared glue and the
bounded feature's parking (its message codec, journal and intake).
"""
