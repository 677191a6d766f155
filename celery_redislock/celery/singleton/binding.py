"""Which values make a task call's signature: its arguments bound as Python binds them.

``f(1)``, ``f(a=1)`` and ``f(1, b=<its default>)`` are one job: the arguments are bound
to the signature of the task's ``run`` (so without ``self`` for ``bind=True`` tasks and
class-based tasks) with the defaults applied. Neither spelling nor keyword order
matters; ``*args`` stay a sequence and ``**kwargs`` a mapping under their own names.
The ``unique_on`` option picks some of them; a name it gives that is no parameter is
looked up in ``**kwargs``, when the task takes those.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...errors import ConfigurationError
from ..config import task_option
from ..execution import AnyTask
from .canonical import UNSET

__all__ = [
    "bind_arguments",
    "check_unique_on",
    "select_arguments",
]

_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


def _signature(task: AnyTask) -> inspect.Signature | None:
    """The signature of the task's ``run`` (without ``self`` when bound); None when it
    cannot be introspected (then calls are keyed on their arguments as given)."""
    try:
        return inspect.signature(task.run)
    except (TypeError, ValueError):
        return None


def bind_arguments(
    task: AnyTask, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], frozenset[str]]:
    """Bind a call of ``task`` as Python would: ``({name: value}, names defaulted)``.

    Raises TypeError, as the call itself would, for arguments that do not bind.
    """
    signature = _signature(task)
    if signature is None:
        return {"*args": list(args), "**kwargs": dict(kwargs)}, frozenset()
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{task.name}(): {exc}") from None
    given = set(bound.arguments)
    bound.apply_defaults()
    return dict(bound.arguments), frozenset(bound.arguments.keys() - given)


def check_unique_on(task: AnyTask) -> tuple[str, ...] | None:
    """The task's ``unique_on`` names, sorted; None for "all arguments". Raises if bad."""
    value = task_option(task, "unique_on")
    if value is None:
        return None
    # One string is one name, never an iterable of one-letter names.
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(
        isinstance(n, str) and n for n in names
    ):
        raise ConfigurationError(
            f"unique_on of task {task.name!r} must be a list of argument names, got {value!r}"
        )
    if task_option(task, "lock_key") is not None:
        raise ConfigurationError(f"task {task.name!r} sets both unique_on and lock_key")
    signature = _signature(task)
    params = signature.parameters if signature is not None else {}
    if signature is not None and all(p.kind is not _VAR_KEYWORD for p in params.values()):
        for name in names:
            if name not in params:
                raise ConfigurationError(
                    f"unique_on of task {task.name!r} names {name!r}, which is not an "
                    f"argument of {task.name}{signature}"
                )
    return tuple(sorted(set(names)))


def select_arguments(
    task: AnyTask, arguments: dict[str, Any], names: Iterable[str]
) -> dict[str, Any]:
    """Keep the ``names`` of the bound ``arguments``; a name missing from them is
    read from ``**kwargs`` (:data:`UNSET` when absent)."""
    signature = _signature(task)
    params = signature.parameters.values() if signature is not None else ()
    var_keyword = next((p.name for p in params if p.kind is _VAR_KEYWORD), "**kwargs")
    extra = arguments.get(var_keyword) or {}
    return {n: arguments[n] if n in arguments else extra.get(n, UNSET) for n in names}
