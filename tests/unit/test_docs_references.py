"""The tests, benchmarks and files the README and docs/ name exist (#28): the comparison
table and the failure-semantics rows cite a test per fact, so a renamed or deleted test
must not leave the citation behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NAMED_TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
NAMED_FILE = re.compile(
    r"`((?:tests|benchmarks|docs|example_project)/[\w/.]+\.(?:py|md|json|yml))`"
)


def test_every_named_test_exists() -> None:
    missing = []
    for page in PAGES:
        for path, name in NAMED_TEST.findall(page.read_text()):
            source = ROOT / path
            if not source.exists() or not re.search(
                rf"^\s*(async )?def {name}\(", source.read_text(), re.M
            ):
                missing.append(f"{page.relative_to(ROOT)}: {path}::{name}")
    assert not missing, missing


def test_every_named_file_exists() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in NAMED_FILE.findall(page.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, missing
