"""The settings' defaults the documentation states are the code's (#28).

Every ``app.conf.get("redislock_<name>", <default>)`` in the package gives the default the
code uses; every place in docs/ (and the README) that states a default for such a
setting -- a settings-table row ``| `key` | `value` |``, or ``value (`key`)`` /
``(`key`) ... value`` beside an option -- must state the same value.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_redislock"
GET = re.compile(r'get\(\s*"(redislock_\w+)",\s*([A-Za-z_][\w.]*|"[^"]*"|[\d.]+)\s*\)')
VALUE = r"`?(\"[\w.:]+\"|[\d.]+|True|False|\{\})`?(?: s)?"
STATED = [
    # | `key` | `value` | ...
    re.compile(r"^\|\s*`(redislock_\w+)`\s*\|\s*" + VALUE + r"\s*(?:\(|\|)", re.M),
    # value (`key`)   e.g. "0.2 s (`redislock_concurrency_countdown`)"
    re.compile(r"\|\s*" + VALUE + r"\s*\(`(redislock_\w+)`\)"),
    # `key` (value)   e.g. "`redislock_lock_ttl` (30 s)"
    re.compile(r"`(redislock_\w+)` \(" + VALUE + r"\)"),
]


def code_defaults() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        matches = GET.findall(text)
        if not matches:
            continue
        module = importlib.import_module(
            ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        )
        for key, expr in matches:
            try:
                value = ast.literal_eval(expr)
            except ValueError:
                if not hasattr(module, expr):
                    continue  # another setting's value (redlock_max_ttl: queued_ttl)
                value = getattr(module, expr)
            found[key] = value
    return found


def stated_defaults() -> list[tuple[str, str, Any]]:
    stated = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        for pattern in STATED:
            for match in pattern.finditer(text):
                a, b = match.groups()
                key, literal = (a, b) if a.startswith("redislock_") else (b, a)
                stated.append((page.name, key, ast.literal_eval(literal)))
    return stated


def test_every_stated_default_is_the_codes() -> None:
    defaults = code_defaults()
    checked = 0
    for page, key, value in stated_defaults():
        if key not in defaults:
            continue
        checked += 1
        assert value == defaults[key], (
            f"{page}: {key} is stated {value!r}, the code's is {defaults[key]!r}"
        )
    assert checked >= 10, (
        f"only {checked} stated defaults found: the patterns no longer match the pages"
    )
