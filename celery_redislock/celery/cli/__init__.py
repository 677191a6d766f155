"""The ``celery redislock`` command: its group, commands (show, exporter, rates, ...), rendering.

Imports click and the stdlib at load (celery loads every plugin); core and glue per command.
"""

from __future__ import annotations

from . import beat, exporter, rates, release, show  # noqa: F401  (importing them adds the commands to the group)
from .group import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    CommandError,
    NotFound,
    Unavailable,
    redislock,
)

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "CommandError",
    "NotFound",
    "Unavailable",
    "redislock",
]
