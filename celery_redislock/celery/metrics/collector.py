"""The ``prometheus_client`` collector: counters and gauges read from Redis per scrape (#27).

``registry.register(RedisLockCollector(client, prefix))`` in an app that already
serves ``prometheus_client`` metrics; ``celery redislock exporter`` serves one.

Metric names and labels (all ``celery_redislock_*``):

==========================================  ==============================  ============
name                                        labels                          type
==========================================  ==============================  ============
``events_total``                            kind, name, outcome             counter
``wait_seconds``                            kind, name                      histogram
``hold_seconds``                            kind, name                      histogram
``locks_held`` / ``locks_waited``           --                              gauge
``pool_holders`` / ``pool_limit``           pool                            gauge
``pool_waiters`` / ``parked_runs``          pool                            gauge
``parked_oldest_age_seconds``               pool                            gauge
``dead_letters``                            pool                            gauge
``ratelimit_next_admission_seconds``        limiter                         gauge
``ratelimit_penalty_seconds``               limiter                         gauge
``ratelimit_parked_runs``                   limiter                         gauge
``ratelimit_parked_oldest_age_seconds``     limiter                         gauge
``omitted_names``                           kind                            gauge
``up``                                      --                              gauge
``scrape_duration_seconds``                 --                              gauge
==========================================  ==============================  ============

Cardinality: ``kind`` has 5 values, ``outcome`` 16; ``name`` is a task, a pool
named by a string ``concurrency_key``, a limiter, a beat group or entry -- never a
lock key or a per-tenant pool -- so ``events_total`` has at most 5 x 16 x (task
and schedule names) series. ``pool`` and ``limiter`` come from Redis (a callable
``concurrency_key`` may make one pool per tenant): at most ``max_names`` of each
are exported per scrape, the rest counted in ``omitted_names``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ...core.inventory import Entry
from ...core.scripts import RedisClient
from .read import DEFAULT_MAX_NAMES, Histogram, read_counters, read_state
from .schema import BUCKETS

__all__ = ["HISTOGRAMS", "METRIC_NAMES", "NAMESPACE", "RedisLockCollector", "exposed_series"]

logger = logging.getLogger("celery_redislock.metrics")

NAMESPACE: Final = "celery_redislock"

METRIC_NAMES: Final = (
    "events_total",
    "wait_seconds",
    "hold_seconds",
    "locks_held",
    "locks_waited",
    "pool_holders",
    "pool_limit",
    "pool_waiters",
    "parked_runs",
    "parked_oldest_age_seconds",
    "dead_letters",
    "ratelimit_next_admission_seconds",
    "ratelimit_penalty_seconds",
    "ratelimit_parked_runs",
    "ratelimit_parked_oldest_age_seconds",
    "omitted_names",
    "up",
    "scrape_duration_seconds",
)
"""The families the collector exposes, without the ``celery_redislock_`` namespace."""

HISTOGRAMS: Final = ("wait_seconds", "hold_seconds")


def exposed_series() -> frozenset[str]:
    """Every sample name a scrape may carry (a histogram's ``_bucket``, ``_count``,
    ``_sum``), for checking queries against (the dashboards' test)."""
    names = {f"{NAMESPACE}_{n}" for n in METRIC_NAMES if n not in HISTOGRAMS}
    for n in HISTOGRAMS:
        names.update(f"{NAMESPACE}_{n}_{s}" for s in ("bucket", "count", "sum"))
    return frozenset(names)


_BOUNDS: Final = (*(f"{b:g}" for b in BUCKETS), "+Inf")


def _name(short: str) -> str:
    return f"{NAMESPACE}_{short}"


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [(bound, float(n)) for bound, n in zip(_BOUNDS, histogram.cumulative, strict=True)]


class RedisLockCollector(Collector):
    """Reads the counters and gauges under ``prefix`` from ``client`` at each scrape."""

    def __init__(
        self, client: RedisClient, prefix: str, *, max_names: int = DEFAULT_MAX_NAMES
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._max_names = max_names

    def describe(self) -> Iterator[Metric]:
        """Nothing up front: registering must not read Redis."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """One scrape: read Redis and yield every family (``up`` 0 when it failed)."""
        started = time.perf_counter()
        up = GaugeMetricFamily(_name("up"), "1 when the last read of Redis succeeded.")
        try:
            families = list(self._families())
        except Exception as exc:  # a scrape reports the outage instead of failing
            logger.warning("celery_redislock exporter: cannot read Redis: %s", exc)
            families = []
            up.add_metric([], 0.0)
        else:
            up.add_metric([], 1.0)
        yield from families
        yield up
        duration = GaugeMetricFamily(
            _name("scrape_duration_seconds"), "Seconds the last read of Redis took."
        )
        duration.add_metric([], time.perf_counter() - started)
        yield duration

    def _families(self) -> Iterator[Metric]:
        counters = read_counters(self._client, self._prefix)
        events = CounterMetricFamily(
            _name("events"),
            "Lock, permit, parking, rate limit and beat events, by outcome.",
            labels=("kind", "name", "outcome"),
        )
        wait = HistogramMetricFamily(
            _name("wait_seconds"),
            "Seconds a run waited for its permit (in place, re-scheduled or parked).",
            labels=("kind", "name"),
        )
        hold = HistogramMetricFamily(
            _name("hold_seconds"),
            "Seconds a run held its lock or permit.",
            labels=("kind", "name"),
        )
        for c in counters:
            for outcome, n in c.counts.items():
                events.add_metric([c.kind, c.name, outcome], float(n))
            if c.wait is not None:
                wait.add_metric([c.kind, c.name], _buckets(c.wait), c.wait.sum)
            if c.hold is not None:
                hold.add_metric([c.kind, c.name], _buckets(c.hold), c.hold.sum)
        yield events
        yield wait
        yield hold
        yield from self._gauges()

    def _gauges(self) -> Iterator[Metric]:
        state = read_state(self._client, self._prefix, max_names=self._max_names)
        yield GaugeMetricFamily(_name("locks_held"), "Locks held now.", value=state.locks_held)
        yield GaugeMetricFamily(
            _name("locks_waited"),
            "Locks that callers wait for now.",
            value=state.locks_waited,
        )
        per_pool: dict[str, tuple[str, Callable[[Entry], float | None]]] = {
            "pool_holders": ("Permits of the pool held now.", lambda e: len(e.holders)),
            "pool_limit": ("The pool's limit, as its last caller stored it.", lambda e: e.limit),
            "pool_waiters": ("Callers waiting in place for a permit.", lambda e: e.waiters),
            "parked_runs": ("Runs parked in the pool's queue.", lambda e: e.parked),
            "parked_oldest_age_seconds": (
                "Seconds the oldest parked run has waited (0: none parked).",
                lambda e: e.oldest_parked or 0.0,
            ),
            "dead_letters": ("Parked runs dead-lettered.", lambda e: e.dead),
        }
        for short, (text, value) in per_pool.items():
            family = GaugeMetricFamily(_name(short), text, labels=("pool",))
            for entry in state.pools:
                v = value(entry)
                if v is not None:
                    family.add_metric([entry.name], float(v))
            yield family
        admission = GaugeMetricFamily(
            _name("ratelimit_next_admission_seconds"),
            "Seconds until the limiter admits a cost-1 call (0: now).",
            labels=("limiter",),
        )
        penalty = GaugeMetricFamily(
            _name("ratelimit_penalty_seconds"),
            "Seconds left of the limiter's penalty (0: none).",
            labels=("limiter",),
        )
        parked = GaugeMetricFamily(
            _name("ratelimit_parked_runs"),
            "Runs parked for the limiter's admission.",
            labels=("limiter",),
        )
        oldest = GaugeMetricFamily(
            _name("ratelimit_parked_oldest_age_seconds"),
            "Seconds the oldest run parked for the limiter has waited (0: none parked).",
            labels=("limiter",),
        )
        for limiter in state.limiters:
            admission.add_metric([limiter.name], limiter.next_admission)
            penalty.add_metric([limiter.name], limiter.penalty_left)
            parked.add_metric([limiter.name], float(limiter.parked))
            oldest.add_metric([limiter.name], limiter.oldest_parked or 0.0)
        yield admission
        yield penalty
        yield parked
        yield oldest
        omitted = GaugeMetricFamily(
            _name("omitted_names"),
            "Pools or limiters not exported this scrape (beyond max_names).",
            labels=("kind",),
        )
        for kind, n in sorted(state.omitted.items()):
            omitted.add_metric([kind], float(n))
        yield omitted
