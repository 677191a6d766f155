"""The package's shape: no import circle, layers import one way, folders state their role.

Read from the source with ``ast`` (nothing is imported), so it costs milliseconds. Every
import counts, also one inside a function or under ``TYPE_CHECKING``: a circle there is
still a circle for a reader. See docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "celery_redislock"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (a package means its ``__init__``)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    here = name.split(".") if _is_package(name) else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from pkg import name` imports the submodule pkg.name when there is one
            targets = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
            targets.append(module)
        else:
            continue
        # Itself, or a package it sits in (imported before it anyway): not an edge.
        found.update(t for t in targets if t in MODULES and not _within(name, t))
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def test_no_import_circle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in MODULES:
        if name not in state:
            visit(name)


# (importer prefix, imported prefix): a layer never imports what sits above it.
FORBIDDEN = [
    ("celery_redislock.core", "celery_redislock.celery"),
    ("celery_redislock.core", "celery_redislock.testing"),
    ("celery_redislock.errors", "celery_redislock.core"),
    ("celery_redislock.celery.singleton", "celery_redislock.celery.cli"),
    ("celery_redislock.celery.bounded", "celery_redislock.celery.cli"),
]


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_layers_import_one_way(importer: str, imported: str) -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if _within(name, importer)
        for target in targets
        if _within(target, imported)
    )
    assert not wrong, wrong


def test_core_never_imports_celery() -> None:
    for name, path in MODULES.items():
        if _within(name, "celery_redislock.core"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    roots = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    roots = {node.module.split(".")[0]}
                else:
                    continue
                assert not roots & {"celery", "kombu", "click"}, f"{name} imports {roots}"


def test_every_folder_states_its_role() -> None:
    for name, path in MODULES.items():
        if _is_package(name):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            assert doc and doc.strip(), f"{name}: the folder's __init__ needs a docstring"
