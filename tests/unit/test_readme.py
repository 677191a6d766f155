"""The README is the landing page (#28): its two commands come first, and each of its
Python examples is a section of a file under docs/examples/ that
tests/integration/test_docs_examples.py runs."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTION = re.compile(
    r"^[ \t]*# --8<-- \[start:(\w+)\]\n(.*?)^[ \t]*# --8<-- \[end:\1\]\n", re.S | re.M
)


def example_sections() -> set[str]:
    return {
        textwrap.dedent(body).strip("\n")
        for path in (ROOT / "docs" / "examples").glob("*.py")
        for _, body in SECTION.findall(path.read_text())
    }


def test_every_python_example_of_the_readme_is_a_tested_file() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
    assert len(blocks) >= 4  # singleton, bounded, rate limit, beat
    sections = example_sections()
    for block in blocks:
        assert block.strip("\n") in sections, block


def test_the_two_commands_come_first() -> None:
    commands = re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M)
    assert "python -m example_project" in commands[0]
    assert README.split("<!-- test-command -->\n", 1)[1].startswith("```bash\n" + commands[1])
    assert "pytest" in commands[1]


def test_the_landing_page_stays_short() -> None:
    assert len(README.splitlines()) <= 250
