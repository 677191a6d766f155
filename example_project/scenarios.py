"""The load the driver puts on the tasks, from the outside, as a real project would.

* :func:`request_burst` -- web requests calling ``sync_user.delay(user_id)``;
* :func:`partner_batch` -- a batch job calling ``call_partner_api.delay(n)``;
* :func:`redislock_list` -- an operator running ``celery redislock list``.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .processes import APP

__all__ = [
    "Burst",
    "CliOutput",
    "partner_batch",
    "redislock_list",
    "request_burst",
    "results_of",
]


@dataclass
class Burst:
    """What each call of the burst got back, and what the tasks it started returned."""

    users: int = 0
    """How many users the calls were for."""
    threads: int = 0
    """How many request threads made the calls."""
    calls: list[tuple[int, str]] = field(default_factory=list)
    """``(user_id, id of the AsyncResult the call returned)``, in call order."""
    errors: list[str] = field(default_factory=list)
    """Calls that raised instead of returning an AsyncResult."""
    results: dict[str, Any] = field(default_factory=dict)
    """Task id -> the value the task returned."""

    @property
    def calls_made(self) -> int:
        """Every call, whatever it returned or raised."""
        return len(self.calls) + len(self.errors)

    @property
    def sent(self) -> list[str]:
        """Distinct task ids: the calls that really sent a task."""
        return list(dict.fromkeys(task_id for _, task_id in self.calls))

    @property
    def shared_across_users(self) -> int:
        """Task ids returned for more than one user (0: a duplicate always got the
        result of the same user's copy)."""
        users: dict[str, set[int]] = {}
        for user_id, task_id in self.calls:
            users.setdefault(task_id, set()).add(user_id)
        return sum(len(ids) > 1 for ids in users.values())

    @property
    def returned_existing(self) -> int:
        """Calls that got the AsyncResult of a copy already queued or running."""
        return len(self.calls) - len(self.sent)


def request_burst(
    task: Any,
    *,
    calls: int = 60,
    users: int = 5,
    threads: int = 6,
    seconds: float = 3.0,
    seed: int = 7,
) -> Burst:
    """``calls`` requests from ``threads`` threads over about ``seconds``, each doing
    ``task.delay(user_id)`` for one of ``users`` users; then wait for the tasks."""
    rng = random.Random(seed)
    pause = seconds * threads / calls  # mean pause between two calls of one thread
    plan = [(rng.randint(1, users), rng.uniform(0, 2 * pause)) for _ in range(calls)]
    burst, guard = Burst(users=users, threads=threads), threading.Lock()

    def requests(share: list[tuple[int, float]]) -> None:
        for user_id, wait in share:
            time.sleep(wait)
            try:
                result = task.delay(user_id)  # a duplicate returns the existing result
            except Exception as exc:
                with guard:
                    burst.errors.append(f"sync_user({user_id}): {exc!r}")
                continue
            with guard:
                burst.calls.append((user_id, result.id))

    request_threads = [
        threading.Thread(target=requests, args=(plan[i::threads],)) for i in range(threads)
    ]
    for thread in request_threads:
        thread.start()
    for thread in request_threads:
        thread.join()
    burst.results = dict(zip(burst.sent, results_of(task, burst.sent), strict=True))
    return burst


def partner_batch(task: Any, calls: int = 12) -> list[str]:
    """Send ``calls`` partner API calls at once; returns their task ids."""
    return [task.delay(n).id for n in range(calls)]


def results_of(task: Any, task_ids: Sequence[str], timeout: float = 60.0) -> list[Any]:
    """Wait for the tasks to finish; their return values (raise if one failed).

    Polls the states of fresh ``AsyncResult`` objects. The driver keeps only task
    ids: Celery's Redis backend subscribes to the result of every task sent and
    unsubscribes when its ``AsyncResult`` is garbage-collected -- after a Ctrl-C that
    could be at exit, with the private Redis already gone, costing a long retry.
    """
    results = [task.AsyncResult(task_id) for task_id in task_ids]
    deadline = time.monotonic() + timeout
    for result in results:
        while not result.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {result.id} not done after {timeout:g}s")
            time.sleep(0.05)
    for result in results:
        if not result.successful():
            raise RuntimeError(f"task {result.id} ended {result.state}: {result.result!r}")
    return [result.result for result in results]


@dataclass(frozen=True)
class CliOutput:
    """What one run of the CLI printed, and when (Redis server time)."""

    command: str
    at: float
    returncode: int
    output: str


def redislock_list(env: Mapping[str, str], clock: Callable[[], float]) -> CliOutput:
    """Run ``celery -A example_project.app redislock list`` as an operator would.

    ``clock`` (Redis server time) is read when the command ends: most of its time
    goes into starting Python and Celery; it reads Redis just before it exits.
    """
    argv = [sys.executable, "-m", "celery", "-A", APP, "redislock", "list"]
    done = subprocess.run(
        argv,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return CliOutput(
        f"celery -A {APP} redislock list",
        clock(),
        done.returncode,
        (done.stdout + done.stderr).rstrip(),
    )
