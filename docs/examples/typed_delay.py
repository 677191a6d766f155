"""Typed calls: with the stubs of celery-types, mypy checks the arguments of ``.delay()``.

Shown in docs/guides/singleton.md. tests/unit/test_typing.py runs mypy on this file and
expects exactly the error the comment names; tests/integration/test_docs_examples.py
runs it against a private redis-server (``REDIS_URL``), where Python sends the mistyped
call all the same (no worker: the message is purged after).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import singleton_task

app = Celery("typed", broker=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
app.conf.task_default_queue = "docs-typed"
app.conf.redislock_prefix = f"docs-typed-{os.getpid()}"  # a rerun is no duplicate of this run


# --8<-- [start:typed]
@singleton_task(app=app, on_duplicate="raise")
def refresh(user_id: int) -> None: ...


# mypy reports: Argument 1 to "delay" of "Task" has incompatible type "str"; expected "int"
refresh.delay("42")
# --8<-- [end:typed]

app.control.purge()
