"""``celery -A proj beat -S celery_redislock.beat:LeaderScheduler``: run beat on several
hosts; one leads and sends, each scheduled slot at most once (see
:mod:`celery_redislock.celery.beat`)."""

from __future__ import annotations

from .celery.beat import LeaderScheduler

__all__ = ["LeaderScheduler"]
