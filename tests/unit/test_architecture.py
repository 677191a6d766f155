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


# -- other libraries through their public interfaces only (#30) ---------------------

UPSTREAM = "celery_redislock.celery.upstream"
"""The one module that may use another library's private names, each citing its
upstream issue and tested to fail loudly when the name disappears."""

_FOREIGN = ("redis", "kombu", "celery", "asyncio", "click")
_PRIVATE_ATTRIBUTES = frozenset(
    {
        "_sock",  # redis-py's connection socket
        "_parser",  # redis-py's connection parser
        "_buffer",  # asyncio.StreamReader's
        "_eof",
        "_wait_for_data",
        "_maybe_resume_transport",
        "_connparams",  # kombu's Redis channel
        "_dump_pydantic_arguments",  # Celery's task class
        "_context",  # Celery's worker Request
    }
)
# setattr() on an object of our own, each named: (module, the object's expression).
# State of ours beside another library's object goes in a structure of ours instead
# (Celery's request: celery/request_state.py).
_OWN_SETATTR = frozenset({("celery_redislock.asyncio.notifier", "entry")})


def _is_request(node: ast.expr) -> bool:
    """``request`` or ``<anything>.request``: by its name, a Celery request."""
    text = ast.unparse(node)
    return text == "request" or text.endswith(".request")


def _foreign_private_uses(name: str, path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    found = [f"{name}: '# fmt: skip'" for line in source.splitlines() if "# fmt: skip" in line]
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] in _FOREIGN and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{name}:{line}: from {node.module} import")
            found += [
                f"{name}:{line}: imports {node.module}.{a.name}"
                for a in node.names
                if parts[0] in _FOREIGN and a.name.startswith("_")
            ]
        elif isinstance(node, ast.Import):
            found += [
                f"{name}:{line}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in _FOREIGN
                and any(p.startswith("_") for p in a.name.split(".")[1:])
            ]
        elif isinstance(node, ast.Attribute):
            if node.attr in _PRIVATE_ATTRIBUTES:
                found.append(f"{name}:{line}: .{node.attr}")
            elif node.attr == "maps" and ast.unparse(node.value).endswith("conf"):
                found.append(f"{name}:{line}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value in _PRIVATE_ATTRIBUTES:
            found.append(f"{name}:{line}: {node.value!r}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
            target = ast.unparse(node.args[0])
            if target not in ("self", "cls") and (name, target) not in _OWN_SETATTR:
                found.append(f"{name}:{line}: setattr({target}, ...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                f"{name}:{line}: {ast.unparse(t)} = ..."
                for t in targets
                if isinstance(t, ast.Attribute) and _is_request(t.value)
            ]
    return found


def test_other_libraries_only_through_their_public_names() -> None:
    wrong = [
        use
        for name, path in MODULES.items()
        if name != UPSTREAM
        for use in _foreign_private_uses(name, path)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from redis._parsers import Encoder\n"
        "x = conn._sock\n"
        "y = getattr(reader, '_buffer')\n"
        "z = app.conf.maps\n"
        "setattr(task.request, 'mine', 1)\n"
        "setattr(request, ATTEMPT, entry_id)\n"
        "self.request.mine = 2\n"
        "w = 1  # fmt: skip\n",
        encoding="utf-8",
    )
    assert len(_foreign_private_uses("sample", sample)) == 8
