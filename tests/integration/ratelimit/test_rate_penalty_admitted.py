"""A penalty holds back runs the limiter admitted before it (a new user's 429, #29):
``RateLimited(retry_after=s)`` says "every worker holds back for s seconds", and the
runs admitted at send a moment earlier -- published at once, their admission reserved
-- must not call the API that just answered 429 either. A real ``celery worker``
(prefork, 1 process, so the runs start one after the other in sending order).

Before: a run claimed ahead kept its admission whatever happened meanwhile
(``capacity_take_reserved``: "nothing is asked again"), so the four runs sent with the
one that met the 429 all started within ~50 ms after the penalty was set. Now a penalty
in force when such a run starts refunds its admission and parks it again: it starts
when the penalty ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import wait_until
from ..workers import AppModule, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.serial]

PENALTY = 2.0

BODY = """
from celery_redislock import RateLimited, rate_limited_task
RECORDS = {records!r}

@rate_limited_task(app=app, bind=True, global_rate_limit="20/s", global_rate_key="api")
def call(self, n):
    with open(RECORDS, "a") as out:
        out.write(f"{{time.time()}} {{n}} {{self.request.retries}}\\n")
    if n == 0 and not os.path.exists(RECORDS + ".429"):
        open(RECORDS + ".429", "w").close()
        raise RateLimited("429 Too Many Requests", retry_after={penalty})
    return n
"""


def _runs(records: Path) -> list[tuple[float, int]]:
    if not records.exists():
        return []
    rows = (line.split() for line in records.read_text().splitlines() if line.strip())
    return [(float(at), int(n)) for at, n, _ in rows]


def test_runs_admitted_before_a_penalty_start_after_it(tmp_path: Path, redis_url: str) -> None:
    records = tmp_path / "runs.txt"
    module = AppModule(tmp_path, redis_url, BODY.format(records=str(records), penalty=PENALTY))
    with WorkerProcess(module, concurrency=1) as worker:
        tasks = module.load()
        results = [tasks.call.delay(n) for n in range(5)]  # 5 of 20/s: all admitted at send
        wait_until(lambda: len(_runs(records)) >= 6, timeout=20, what="6 starts")
        assert sorted(r.get(timeout=10) for r in results) == list(range(5))
        log = worker.log()
    runs = _runs(records)
    penalized = runs[0]
    assert penalized[1] == 0, runs  # the first sent ran first, and met the 429
    others = [at - penalized[0] for at, n in runs[1:] if n != 0]
    assert sorted(n for _, n in runs) == [0, 0, 1, 2, 3, 4], runs
    # Each admitted before the penalty, started after it ended (its end is set after
    # the body's clock was read: later, never earlier).
    assert min(others) >= PENALTY - 0.05, (others, log[-3000:])
