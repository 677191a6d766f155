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
from typing import Any, NamedTuple

from ...errors import ConfigurationError
from ..config import task_option
from ..execution import AnyTask
from .canonical import UNSET

__all__ = [
    "bind_arguments",
    "check_unique_on",
    "has_immutable_defaults",
    "select_arguments",
]

_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
# (run function, bound?) -> its signature and simple form (see _Form);
# inspect.signature costs more than a key.
_signatures: dict[tuple[Any, bool], tuple[inspect.Signature | None, _Form | None]] = {}


def _signature_and_form(task: AnyTask) -> tuple[inspect.Signature | None, _Form | None]:
    run = task.run
    cache_key = (getattr(run, "__func__", run), hasattr(run, "__self__"))
    cached = _signatures.get(cache_key)
    if cached is None:
        try:
            signature: inspect.Signature | None = inspect.signature(run)  # drops self
        except (TypeError, ValueError):  # not introspectable: key on args as given
            signature = None
        cached = _signatures[cache_key] = (
            signature,
            _form(signature) if signature is not None else None,
        )
    return cached


def _signature(task: AnyTask) -> inspect.Signature | None:
    return _signature_and_form(task)[0]


_SIMPLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class _Form(NamedTuple):
    """A signature whose parameters are all ordinary ones (no ``*args``, ``**kwargs``
    or positional-only): binding it is then a few dict operations instead of
    ``Signature.bind``, which costs more than the rest of a key."""

    positional: tuple[str, ...]
    names: tuple[str, ...]
    name_set: frozenset[str]
    defaults: dict[str, Any]


def _form(signature: inspect.Signature) -> _Form | None:
    params = signature.parameters.values()
    if not all(p.kind in _SIMPLE for p in params):
        return None
    names = tuple(p.name for p in params)
    return _Form(
        positional=tuple(p.name for p in params if p.kind is _SIMPLE[0]),
        names=names,
        name_set=frozenset(names),
        defaults={p.name: p.default for p in params if p.default is not p.empty},
    )


def _bind_simple(
    form: _Form, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], frozenset[str]] | None:
    """``Signature.bind`` + ``apply_defaults`` for a simple signature; None when the
    call does not bind (``Signature.bind`` then raises its own TypeError)."""
    if len(args) > len(form.positional):
        return None
    given = dict(zip(form.positional, args, strict=False))  # args may be fewer
    for name, value in kwargs.items():
        if name in given or name not in form.name_set:
            return None
        given[name] = value
    if len(given) == len(form.names):
        return {name: given[name] for name in form.names}, frozenset()
    bound: dict[str, Any] = {}
    defaulted = []
    for name in form.names:
        if name in given:
            bound[name] = given[name]
        elif name in form.defaults:
            bound[name] = form.defaults[name]
            defaulted.append(name)
        else:
            return None  # a required argument is missing
    return bound, frozenset(defaulted)


_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None)})


def has_immutable_defaults(task: AnyTask) -> bool:
    """True when every default of the task's parameters is a plain immutable scalar,
    so a call's key cannot change while its arguments stay the same (a list default
    appended to later would change it)."""
    signature = _signature(task)
    if signature is None:
        return True  # keyed on the arguments as given: no defaults take part
    return all(
        p.default is p.empty or type(p.default) in _IMMUTABLE for p in signature.parameters.values()
    )


def bind_arguments(
    task: AnyTask, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], frozenset[str]]:
    """Bind a call of ``task`` as Python would: ``({name: value}, names defaulted)``.

    Raises TypeError, as the call itself would, for arguments that do not bind.
    """
    signature, form = _signature_and_form(task)
    if form is not None:
        fast = _bind_simple(form, args, kwargs)
        if fast is not None:
            return fast
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
