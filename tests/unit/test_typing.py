"""The fixed-string options are ``Literal`` types: mypy catches a bad value where the
option is written with a type; with celery-types, ``.delay()`` is typed too."""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
from celery import Celery
from celery_redislock import SingletonTask, bounded_task, singleton_task

app = Celery("typed")

@singleton_task(app=app, on_duplicate="raise", singleton_mode="until_and_while_executing")
def refresh(user_id: int) -> None: ...

refresh.delay(1)
refresh.apply_async((1,), on_duplicate="drop", singleton=False, lock_ttl=5)
refresh.apply_async((1,), on_duplicate="rais")  # line 12: error
refresh.delay("not an int")  # line 13: error (celery-types)

class Mine(SingletonTask[[int], None]):
    on_running_duplicate = "skipp"  # line 16: error

wrong = singleton_task(app=app, on_duplicate="bogus")  # line 18: error
also_wrong = bounded_task(concurrency_limit=2, singleton_mode="until_dun")  # line 19: error
"""


def _mypy(path: Path, tmp_path: Path) -> tuple[str, str]:
    """``mypy --strict`` of ``path`` under the project's configuration, from scratch
    (a cache of the test's own): its report and its errors."""
    out, err, _ = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "c"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(path),
        ]
    )
    return out, err


def test_mypy_catches_bad_option_strings_and_typed_delay(tmp_path: Path) -> None:
    source = tmp_path / "typed_snippet.py"
    source.write_text(SNIPPET)
    out, err = _mypy(source, tmp_path)
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert lines == {12, 13, 16, 18, 19}, out + err


def test_the_typed_example_of_the_docs_fails_as_it_says(tmp_path: Path) -> None:
    """docs/examples/typed_delay.py (docs/guides/singleton.md): mypy reports the one
    error its comment quotes, on the call below the comment, and nothing else."""
    example = ROOT / "docs" / "examples" / "typed_delay.py"
    lines = example.read_text().splitlines()
    said = next(i for i, line in enumerate(lines, 1) if line.startswith("# mypy reports: "))
    out, err = _mypy(example, tmp_path)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out + err
    quoted = lines[said - 1].removeprefix("# mypy reports: ")
    assert f":{said + 1}: error: {quoted}  [arg-type]" in errors[0], errors


RATE_SNIPPET = """
from celery import Celery
from celery_redislock import rate_limited_task

app = Celery("typed")

@rate_limited_task(global_rate_limit="10/s", global_rate_key="openai", app=app)
def summarize(doc_id: int) -> None: ...

summarize.delay(1)
summarize.delay("not an int")  # line 11: error (celery-types)
"""


def test_rate_limited_task_is_typed_as_the_other_decorators(tmp_path: Path) -> None:
    """``@rate_limited_task(...)`` gives a typed task under ``--strict``, as
    ``@bounded_task(...)`` does: no "untyped decorator" error, and ``.delay()`` checks
    its arguments."""
    source = tmp_path / "rate_snippet.py"
    source.write_text(RATE_SNIPPET)
    out, err = _mypy(source, tmp_path)
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert lines == {11}, out + err


LOOKUP_SNIPPET = """
from celery import Celery
from celery.result import AsyncResult
from celery_redislock import singleton_task

app = Celery("typed")

@singleton_task(app=app)
def refresh(user_id: int) -> str:
    return str(user_id)

key: str = refresh.singleton_key(1)
holder: AsyncResult[str] | None = refresh.singleton_holder(user_id=1)
refresh.singleton_key("not an int")  # line 14: error
refresh.singleton_holder(1, 2)  # line 15: error
"""


def test_singleton_key_and_holder_take_the_tasks_arguments(tmp_path: Path) -> None:
    """``singleton_key``/``singleton_holder`` are checked against the task's own
    parameters, as ``.delay()`` is."""
    source = tmp_path / "lookup_snippet.py"
    source.write_text(LOOKUP_SNIPPET)
    out, err = _mypy(source, tmp_path)
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert lines == {14, 15}, out + err
