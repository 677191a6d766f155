"""Every code block of the documentation site is run by a test, or says what it is
(#28): Python is a section of a docs/examples/ file (pymdownx.snippets; run by
tests/integration/test_docs_examples.py) or a setup block of docs/migration.md (run by
tests/integration/test_migration_guide.py); getting-started's two commands are the
README's, which CI runs; the other shell blocks are commands to type, listed here, so
that a new block must say which it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
INCLUDE = re.compile(r'^--8<-- "[\w.]+\.py(:\w+)?"$')
# Shell commands shown, not run by a test (a long benchmark, a deployment's command).
COMMANDS = {
    ("benchmarks.md", ".venv/bin/python benchmarks/bench_lock.py        # ~30 s"),
    (
        "getting-started.md",
        'celery -A proj worker -l INFO     # among its first lines: "the lock Redis, ..., answers"',
    ),
    ("guides/beat.md", "celery -A proj beat -S celery_redislock.beat:LeaderScheduler"),
    ("operations/cli.md", "celery -A proj redislock list [--kind lock|semaphore] [--json]"),
    ("operations/metrics.md", "pip install 'celery-redislock[metrics]'"),
}
# Not code: a picture of the layout (page, how its first line starts).
TEXT = {("architecture.md", "example_project/")}


def blocks() -> list[tuple[str, str, str]]:
    """(page, the fence's info string, the body) of every fenced block of docs/."""
    return [
        (str(page.relative_to(DOCS)), info.strip(), body)
        for page in sorted(DOCS.rglob("*.md"))
        for info, body in FENCE.findall(page.read_text())
    ]


def test_every_code_block_is_run_or_listed() -> None:
    unaccounted = []
    readme_commands = re.findall(
        r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M
    )
    migration_setups = 0
    for page, info, body in blocks():
        lines = body.strip("\n").splitlines()
        first = lines[0].strip() if lines else ""
        if lines and all(INCLUDE.match(line.strip()) for line in lines if line.strip()):
            continue  # snippets of docs/examples/ files, each checked to exist by the build
        if page == "migration.md" and info == "python":
            migration_setups += 1
            continue
        if page == "getting-started.md" and info == "bash" and body in readme_commands[:2]:
            continue
        if info == "bash" and (page, first) in COMMANDS:
            continue
        if info == "" and any(page == p and first.startswith(t) for p, t in TEXT):
            continue
        unaccounted.append(f"{page}: ```{info} {first!r}")
    assert not unaccounted, unaccounted
    # test_migration_guide.py runs the first Python block of each "## From" section
    sections = (DOCS / "migration.md").read_text().count("\n## From ")
    assert migration_setups == sections


def test_getting_started_shows_the_readmes_two_commands() -> None:
    readme = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    page = [
        body for page, info, body in blocks() if page == "getting-started.md" and info == "bash"
    ]
    assert page[:2] == readme[:2]


def test_getting_started_shows_each_feature_and_how_to_run_it() -> None:
    """A new user (#29) read "Singleton tasks and bounded concurrency for Celery" and a
    Quickstart of those two: the rate limit the README shows was not there, nor how to
    start a worker on the quickstart's app and see what it holds."""
    page = (DOCS / "getting-started.md").read_text()
    quickstart = page[page.index("## Quickstart") : page.index("## The example project")]
    for snippet in ("singleton.py:task", "bounded.py:task", "ratelimit_task.py:task"):
        assert f'--8<-- "{snippet}"' in quickstart, snippet
    assert "celery -A proj worker" in quickstart
    assert "celery -A proj redislock list" in quickstart
    assert "beat" in page[: page.index("## Quickstart")]
