"""A rate-limited pool's limiter and its queue of parked runs, on the app's lock Redis.

The limiter (:class:`~celery_redislock.core.ratelimit.RedisRateLimiter`) and the queue
(a :class:`~celery_redislock.core.parking.ParkingQueue` of a
:class:`~celery_redislock.core.parking.RateCapacity`) share the limiter's keys: a run
admitted straight away and a parked run claimed at its admission time are charged to
the same log. Claimed runs are published through the app
(:func:`~..bounded.parking.publish_claimed`), and the queue's kind, ``"rate"``, is
registered so that sweepers and recovery find these queues too.

May import the core, the shared glue and the bounded feature's parking.
"""

from __future__ import annotations

from typing import Final

from celery import Celery

from ...core.parking import ParkingQueue, RateCapacity
from ...core.ratelimit import RedisRateLimiter
from ...errors import ConfigurationError
from ..bounded.journal import ParkSpec
from ..bounded.parking import Kept, claimed_publisher, register_kind
from ..bounded.settings import park_keep, taken_memory
from ..client import get_redis
from ..config import settings_for

__all__ = ["AHEAD", "RATE", "attached_queue", "limiter_for", "rate_queue", "rate_spec"]

RATE: Final = "rate"
"""The kind of a rate-limited pool's capacity (see ``lib_capacity.lua``)."""

AHEAD: Final = 0.03
"""Seconds before its admission time a parked run is claimed and published: about its
way from a pump through the broker to a pool process (10-30 ms measured on a loaded
2-core machine, #25). Charged at its admission time, it waits there for it when it
comes early (a few ms, in ``ParkingQueue.take``); a run that comes late is charged at
its start, as before -- so the limit holds on the runs' starts, and a period's starts
no longer drift by the way through the broker."""


def limiter_for(app: Celery, pool: str, rates: tuple[str, ...]) -> RedisRateLimiter:
    """The limiter of ``pool`` with ``rates`` on the app's lock Redis."""
    return RedisRateLimiter(get_redis(app), pool, rate=list(rates), prefix=settings_for(app).prefix)


_queues: Final[Kept[ParkingQueue]] = Kept()


def rate_queue(app: Celery, pool: str, rates: tuple[str, ...]) -> ParkingQueue:
    """The queue of ``pool``'s parked runs (each costs 1), publishing through the app.

    The recently used are kept, by everything they are made of (the settings are read
    each time, so a change counts from the next run on): a queue keeps no state of
    its own, and making one -- the rates parsed, the keys encoded -- was about a third
    of the rate guard's CPU per run in a worker (cProfile of a backlog, #25)."""
    settings = settings_for(app)
    client = get_redis(app)
    keep, memory = park_keep(app), taken_memory(app)
    made_of = (client, settings.prefix, pool, rates, settings.lock_ttl, keep, memory)
    return _queues.get(
        app,
        made_of,
        lambda: ParkingQueue(
            RateCapacity(client, pool, rate=list(rates), prefix=settings.prefix, ahead=AHEAD),
            reserve_ttl=settings.lock_ttl,
            keep=keep,
            on_claimed=claimed_publisher(app),
            taken_memory=memory,
        ),
    )


def rate_spec(queue: ParkingQueue, rates: tuple[str, ...]) -> ParkSpec:
    """What names ``queue`` (of rates ``rates``) for a sweeper or recovery."""
    return ParkSpec(RATE, queue.capacity.name, queue.capacity.prefix, rates)


def attached_queue(app: Celery, pool: str) -> tuple[ParkingQueue, RedisRateLimiter] | None:
    """The queue and limiter of ``pool`` with the rates stored with its limiter (for a
    pump or sweeper that knows only the name); None when Redis holds none."""
    limiter = RedisRateLimiter.attach(get_redis(app), pool, prefix=settings_for(app).prefix)
    if limiter is None:
        return None
    rates = tuple(rate.text for rate in limiter.rates)
    return rate_queue(app, pool, rates), limiter


def _queue_of(app: Celery, spec: ParkSpec) -> ParkingQueue:
    if spec.terms:
        return rate_queue(app, spec.pool, tuple(str(rate) for rate in spec.terms))
    attached = attached_queue(app, spec.pool)
    if attached is None:
        raise ConfigurationError(f"rate limiter {spec.pool!r} has no rates stored in Redis")
    return attached[0]


register_kind(RATE, _queue_of)
