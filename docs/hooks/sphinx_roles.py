"""A griffe extension for the API reference (#28): the docstrings cross-reference with
Sphinx roles (``:class:`Lease```, ``:meth:`~RedisLock.acquire```, ``:mod:`.renewal```),
which read well in ``help()`` but which mkdocstrings would print raw. Before the
docstrings are rendered, each role becomes a link to the object when the site
documents it, else its name in code.

Targets resolve as Sphinx resolves them: ``~`` shows the last name only, ``Title
<target>`` shows the title, and a name is looked up in the enclosing class, then
module, then package chain, then as an absolute path, then (a unique) dotted suffix
of any object of the package. The link is an autorefs ``optional`` reference: an
object that no page renders (the modules behind the public names) stays code rather
than failing ``mkdocs build --strict``. mkdocs.yml loads it (``extensions:``)."""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterator
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const):`([^`]+)`")
TITLED = re.compile(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>$", re.S)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined below it (aliases, re-exports, left out)."""
    yield obj
    for member in obj.members.values():
        if isinstance(member, griffe.Object):
            yield from _objects(member)


def _names(objects: list[griffe.Object]) -> dict[str, str]:
    """Every name by which an object can be reached (its own path, a re-export's, an
    inherited member's under the subclass) -> the object's own path, which is the
    identifier autorefs knows it by wherever a page renders it."""
    names = {}
    for obj in objects:
        names[obj.path] = obj.path
        members = obj.all_members if isinstance(obj, griffe.Class) else obj.members
        for name, member in members.items():
            try:
                target = member.final_target if isinstance(member, griffe.Alias) else member
                names[f"{obj.path}.{name}"] = target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                pass  # a name imported from another package: not ours to link
    return names


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of a package's docstrings into Markdown with links."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        objects = list(_objects(pkg))
        names = _names(objects)
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(
                    functools.partial(_render, scope=obj, names=names), obj.docstring.value
                )


def _render(role: re.Match[str], *, scope: griffe.Object, names: dict[str, str]) -> str:
    """A role's Markdown: an optional autorefs link around the name in code."""
    text = role[1]
    titled = TITLED.match(text)
    target = re.sub(r"\s+", "", titled["target"] if titled else text)  # wrapped lines
    target = target.lstrip("!")
    short = target.startswith("~")
    target = target.lstrip("~")
    title = titled["title"] if titled else target.rsplit(".", 1)[-1] if short else target
    path = _resolve(target, scope, names)
    code = f"<code>{html.escape(title.lstrip('.'))}</code>"
    if path is None:
        return code
    return f'<autoref identifier="{path}" optional>{code}</autoref>'


def _resolve(target: str, scope: griffe.Object, names: dict[str, str]) -> str | None:
    """The path of the object ``target`` names from inside ``scope``, or None."""
    name = target.lstrip(".")
    candidates = []
    parent: griffe.Object | None = scope
    while parent is not None:  # the enclosing class, its module, the package chain
        candidates.append(f"{parent.path}.{name}")
        parent = parent.parent
    candidates.append(name)
    for candidate in candidates:
        if candidate in names:
            return names[candidate]
    suffix = {path for known, path in names.items() if known.endswith(f".{name}")}
    return suffix.pop() if len(suffix) == 1 else None
