"""The documentation's examples are real files; run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_testing_your_tasks_example_passes() -> None:
    """docs/test_your_tasks.py, as a user would run it with pytest."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "docs" / "test_your_tasks.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_readme_points_at_the_example() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/test_your_tasks.py" in readme
