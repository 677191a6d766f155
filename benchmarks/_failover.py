"""What bench_failover.py (Sentinel) and bench_cluster.py (Redis Cluster) share: the
steady-state cost of each acknowledgement mode, one trial of a lock's primary killed
right after a grant, and the table of those trials (not part of the package)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from _common import percentile, print_table

from celery_redislock import NotReplicated, RedisLock

TTL = 8.0
"""The lease of a trial's holder and contender (seconds)."""

WORK = 0.5
"""Seconds after the kill at which the holder "finishes its work" and releases."""


def until_answered(
    call: Callable[[], Any], deadline: float, errors: tuple[type[BaseException], ...]
) -> Any:
    """``call()``, retried on ``errors`` while no primary answers (the failover window)."""
    while True:
        try:
            return call()
        except errors:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def steady_state(
    client: Any, modes: Mapping[str, int], rounds: int, replica_timeout: float
) -> dict[str, float]:
    """Acquire-only p50 (µs) per mode (``min_replicas`` by name), interleaved call by
    call, on a healthy deployment; 50 warm-up rounds first (the first WAIT after a sync
    can take ~0.9 s)."""
    locks = {
        mode: RedisLock(
            client, f"steady-{mode}", ttl=10, min_replicas=n, replica_timeout=replica_timeout
        )
        for mode, n in modes.items()
    }
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    order = list(modes)
    for i in range(rounds + 50):
        random.shuffle(order)
        for mode in order:
            started = time.perf_counter()
            lease = locks[mode].acquire(blocking=False)
            took = time.perf_counter() - started
            assert lease is not None
            lease.release()
            if i >= 50:
                samples[mode].append(took)
    return {mode: percentile(values, 50) * 1e6 for mode, values in samples.items()}


def kill_trial(
    holder: RedisLock,
    contender: RedisLock,
    kill: Callable[[], Any],
    errors: tuple[type[BaseException], ...],
) -> tuple[dict[str, Any], Any]:
    """``holder`` is granted its lease, ``kill()`` kills its primary at once; the holder
    releases ``WORK`` s after the kill and ``contender`` acquires from the kill on, both
    retrying on ``errors`` until a primary answers. Returns what happened and what
    ``kill()`` returned (``{"refused": True}`` and None when the grant was refused:
    ``NotReplicated``; nothing was killed then)."""
    asked_at = time.monotonic()  # the lease counts from here, by the holder's clock
    try:
        lease = holder.acquire(blocking=False)
    except NotReplicated:
        return {"refused": True}, None
    assert lease is not None
    killed = kill()
    killed_at = time.monotonic()
    out: dict[str, Any] = {"refused": False, "fence": lease.fence}

    def release() -> None:
        time.sleep(max(0.0, WORK - (time.monotonic() - killed_at)))
        out["released"] = until_answered(lease.release, killed_at + 60, errors)
        out["released_at"] = time.monotonic()

    releaser = threading.Thread(target=release)
    releaser.start()
    second = until_answered(lambda: contender.acquire(timeout=30), killed_at + 60, errors)
    granted_at = time.monotonic()
    releaser.join(60)
    assert second is not None
    out["usable"] = granted_at - killed_at
    out["lost"] = lease.lost
    # Lost with the primary, the holder's lease was still valid by its own clock
    # (until grant + TTL) when the second client was granted the name.
    out["double"] = not out["released"] and granted_at < asked_at + TTL
    out["fence_ok"] = second.fence > lease.fence
    out["stale_touched"] = not second.extend()  # the stale release left it alone?
    second.release()
    return out, killed


def report_kill(
    first: str, results: Mapping[str, list[dict[str, Any]]], cost: Mapping[str, float]
) -> None:
    """Print a row per mode (``first`` heads that column) from its trials and its
    steady-state cost."""
    rows = []
    for mode, outcomes in results.items():
        done = [o for o in outcomes if not o["refused"]]
        usable = [o["usable"] for o in done]
        rows.append(
            [
                mode,
                len(outcomes),
                sum(o["refused"] for o in outcomes),
                sum(o["double"] for o in done),
                sum(o["lost"] for o in done),
                f"{percentile(usable, 50):.2f}",
                f"{max(usable, default=float('nan')):.2f}",
                sum(not o["fence_ok"] for o in done),
                sum(o["stale_touched"] for o in done),
                f"{cost[mode]:.0f}",
                f"{cost[mode] / cost['no acks']:.2f}x",
            ]
        )
    print_table(
        [
            first,
            "trials",
            "refused",
            "double grants",
            "reported lost",
            "usable p50 s",
            "usable max s",
            "fence not increasing",
            "stale touched new",
            "acquire p50 µs",
            "vs no acks",
        ],
        rows,
    )
