"""Fixtures of the unit tests (no Redis needed: clients connect lazily)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """A bare app, not the current one (a module may define its own ``app``)."""
    # Celery prefers these to app.conf; a developer's shell must not change the tests.
    for name in ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL", "CELERY_RESULT_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    app = Celery("unit", set_as_current=False)
    yield app
    app.close()
