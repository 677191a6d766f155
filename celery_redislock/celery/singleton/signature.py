"""The singleton key of a task call: the task's name and its canonical signature.

The arguments are bound by :mod:`.binding` (so ``f(1)`` and ``f(a=1)`` are one job).
Each value then goes through the task's serializer and back, so the producer sees what
the worker will receive (a tuple becomes a list under json) and both compute the same
key; :mod:`.canonical` encodes and hashes the result. The key is
``"<task name>:<digest>"``: arguments never reach Redis in the clear.

Options (read once, with the task's others: :class:`.options.SingletonOptions`):
``unique_on`` (argument names making the key; default all) and ``lock_key`` (a
callable, called like the task with the arguments as the worker receives them,
returning the whole key string).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kombu.exceptions import KombuError, SerializerNotInstalled
from kombu.serialization import dumps, loads

from ...errors import ConfigurationError
from ..execution import AnyTask
from ..options import options_of
from .binding import bind_arguments, select_arguments
from .canonical import UNSET, canonical_json, digest
from .options import SingletonOptions

__all__ = ["call_key", "received_key", "serializer_for"]


_IDENTITY_SERIALIZERS = frozenset({"json", "pickle"})
_SCALARS = frozenset({str, int, float, bool, type(None)})


def serializer_for(task: AnyTask, options: Mapping[str, Any] | None = None) -> str:
    """The serializer a message of ``task`` is sent with: the call's, the task's, the app's."""
    name = (options or {}).get("serializer") or task.serializer or task.app.conf.task_serializer
    return str(name)


def _roundtrip(value: object, serializer: str) -> Any:
    # What the worker will decode; accept= only lets back the type we just wrote.
    content_type, encoding, data = dumps(value, serializer)
    return loads(data, content_type, encoding, accept=[content_type])


def _normalized(task: AnyTask, name: str, value: object, serializer: str, defaulted: bool) -> Any:
    # One argument at a time, only to name the one at fault, or to stand UNSET for a
    # default that cannot travel (a sentinel object(): equal on both sides, never sent).
    try:
        normal = UNSET if value is UNSET else _roundtrip(value, serializer)
        canonical_json(normal)
        return normal
    except SerializerNotInstalled as exc:
        raise ConfigurationError(f"serializer of task {task.name!r}: {exc}") from exc
    except (KombuError, TypeError, ValueError) as exc:
        if defaulted:
            return UNSET
        raise ConfigurationError(
            f"argument {name!r} of task {task.name!r} cannot be part of its singleton key "
            f"with the {serializer!r} serializer ({exc}); leave it out with unique_on, or "
            "give lock_key"
        ) from exc


def _key(
    task: AnyTask, args: object, kwargs: object, serializer: str, opts: SingletonOptions
) -> str:
    args = () if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        raise TypeError(
            f"task args must be a list or tuple and kwargs a mapping, got "
            f"{type(args).__name__} and {type(kwargs).__name__}"
        )
    arguments, defaulted = bind_arguments(task, args, kwargs)
    names, lock_key = opts.unique_on, opts.lock_key  # checked when the options were read
    if lock_key is not None:
        return _custom_key(task, lock_key, args, kwargs, arguments, serializer)
    if names is not None:
        arguments = select_arguments(task, arguments, names)
    if serializer in _IDENTITY_SERIALIZERS and all(
        type(value) in _SCALARS for value in arguments.values()
    ):  # the usual call: such values come back from these serializers as they went in
        return f"{task.name}:{digest(arguments)}"
    try:  # one round trip for all: a dict of round-tripped values, as below
        return f"{task.name}:{digest(_roundtrip(arguments, serializer))}"
    except (KombuError, TypeError, ValueError):
        pass
    normal = {n: _normalized(task, n, v, serializer, n in defaulted) for n, v in arguments.items()}
    return f"{task.name}:{digest(normal)}"


def _custom_key(
    task: AnyTask,
    lock_key: Callable[..., str],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    arguments: dict[str, Any],
    serializer: str,
) -> str:
    try:
        received_args, received_kwargs = _roundtrip([list(args), dict(kwargs)], serializer)
    except (KombuError, TypeError, ValueError):
        for name, value in arguments.items():  # raises, naming the culprit
            _normalized(task, name, value, serializer, defaulted=False)
        raise
    key = lock_key(*received_args, **received_kwargs)
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            f"lock_key of task {task.name!r} must return a non-empty string, got {key!r}"
        )
    return key


def call_key(
    task: AnyTask,
    args: object = None,
    kwargs: object = None,
    options: Mapping[str, Any] | None = None,
    opts: SingletonOptions | None = None,
) -> str:
    """The key of ``task.apply_async(args, kwargs, **options)``, on the producer.

    ``opts``: the task's singleton options, as the caller has them (else read here).
    """
    if opts is None:
        opts = options_of(task).singleton
    # As Task.apply_async does: only a call that asks for pickle keeps its models.
    if opts.dump_models is not None and (options or {}).get("serializer") != "pickle":
        args, kwargs = opts.dump_models(args, kwargs)
    return _key(task, args, kwargs, serializer_for(task, options), opts)


def received_key(
    task: AnyTask,
    args: object,
    kwargs: object,
    serializer: str | None = None,
    opts: SingletonOptions | None = None,
) -> str:
    """The key of a received call (``request.args``, ``request.kwargs``), on the worker.

    Equal to the producer's :func:`call_key` of the same call; ``serializer`` is the
    one the message was sent with when the call overrode the task's; ``opts`` as for
    :func:`call_key`.
    """
    if opts is None:
        opts = options_of(task).singleton
    return _key(task, args, kwargs, serializer or serializer_for(task), opts)
