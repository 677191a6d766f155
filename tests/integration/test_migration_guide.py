"""docs/migration.md is checked against the code: every "ours" snippet runs.

For each library's section: its setup block runs first, then the "ours" cell of every
table row, in order, in one namespace, against a real redis-server (no worker; the
broker is the test Redis). A cell's code spans are its lines; a snippet ending in
``:`` gets a ``pass`` body; one starting with ``@`` decorates ``def job(user_id=0)``
on a fresh app bound to ``app``.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from .workers import LOCKS_DB, db_url

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "migration.md"
SECTIONS = ("python-redis-lock", "redis-py", "celery-singleton", "celery-once")


class _App(Celery):
    """Tasks of its own (not shared with every later app, as ``shared=True`` would)."""

    def task(self, *args: Any, **options: Any) -> Any:
        options.setdefault("shared", False)
        return super().task(*args, **options)


def _cells(row: str) -> list[str]:
    """The cells of a table row, splitting on ``|`` outside code spans."""
    cells, current, in_code = [], "", False
    for char in row.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(current.strip())
            current = ""
        else:
            current += char
    cells.append(current.strip())
    return cells


def section(title: str) -> tuple[str, list[tuple[str, str]]]:
    """The setup code and the (theirs, ours) rows of the section about ``title``."""
    text = GUIDE.read_text()
    start = text.index(f"\n## From {title}")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    setup = re.search(r"```python\n(.*?)```", body, re.S)
    assert setup is not None, f"{title}: no setup block"
    rows = []
    for line in body.splitlines():
        if line.startswith("| `"):
            theirs, ours = _cells(line)
            rows.append((theirs, "\n".join(re.findall(r"`([^`]+)`", ours))))
    return setup[1], rows


@pytest.mark.parametrize("title", SECTIONS)
def test_every_ours_snippet_runs(title: str, redis_url: str, locks: redis.Redis) -> None:
    url = db_url(redis_url, LOCKS_DB)
    setup, rows = section(title)
    assert len(rows) >= 8, f"{title}: the table has {len(rows)} rows"
    namespace: dict[str, Any] = {"__name__": "migration_guide", "REDIS_URL": url}
    apps: list[Celery] = []
    try:
        exec(setup, namespace)
        apps += [v for v in namespace.values() if isinstance(v, Celery)]
        for theirs, code in rows:
            assert code, f"{title}: row {theirs!r} has no code"
            if code.startswith("@"):
                app = _App(f"guide{uuid.uuid4().hex[:8]}", broker=url, set_as_current=False)
                app.conf.update(redislock_url=url)
                apps.append(app)
                namespace["app"] = app
                code += "\ndef job(user_id=0):\n    return user_id\n"
            elif code.rstrip().endswith(":"):
                code += "\n    pass\n"
            try:
                exec(code, namespace)
            except Exception as exc:
                raise AssertionError(f"{title}: ours for {theirs!r} failed:\n{code}") from exc
    finally:
        for app in apps:
            app.close()


def test_the_guide_lists_every_difference_the_issue_names() -> None:
    text = GUIDE.read_text()
    for phrase in (
        "30 s by default",
        "**replaces**",
        "Re-entry needs an owner",
        "`UUID` argument and its `str`",
        "returns `None`",
        "renews",
        'singleton_mode="interval"',
    ):
        assert phrase in text, phrase


def test_the_readme_points_at_the_guide() -> None:
    assert "docs/migration.md" in (ROOT / "README.md").read_text()
