"""The command-line page documents every command of ``celery redislock`` and every
option of each (a new user, #29): until now docs/operations/cli.md listed list,
inspect, release and watch; ``rates``, ``beat``, ``top`` and ``exporter`` were only in
the guides, and the group's help said it inspects "locks and semaphores"."""

from __future__ import annotations

import re
from pathlib import Path

import click

from celery_redislock.celery.cli import redislock

PAGE = Path(__file__).resolve().parents[3] / "docs" / "operations" / "cli.md"


def test_every_command_and_option_is_on_the_cli_page() -> None:
    page = PAGE.read_text()
    missing = []
    for name, command in sorted(redislock.commands.items()):
        usage = " ".join(re.findall(rf"^celery (?:-A proj )?redislock {name}\b.*$", page, re.M))
        if not usage:
            missing.append(f"`celery -A proj redislock {name}` (command)")
        for param in command.params:
            if isinstance(param, click.Option) and max(param.opts, key=len) not in usage:
                missing.append(f"{name} {max(param.opts, key=len)}")
    assert not missing, missing


def test_the_groups_help_names_what_it_shows() -> None:
    first = (redislock.help or "").strip().splitlines()[0]
    for what in ("locks", "semaphores", "rate limiters", "beat"):
        assert what in first, first
