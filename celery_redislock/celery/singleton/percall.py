"""Per-call options of ``apply_async`` and the check that catches option typos.

``task.apply_async(args, on_duplicate="raise")``, ``singleton=False`` (this call takes
no singleton lock, and its run does not either), ``lock_ttl=`` (the running lease of
this call's run: singleton lock and concurrency permit) and ``lock_queued_ttl=`` (this
call's queued lease). Also through ``sig.set(...)`` and canvases. They are taken out
of the options before Celery sees them; what the worker needs travels in headers that
``retry()`` and re-sends keep.

A name that looks like one of ours (``lock_*``, ``singleton_*``, ``concurrency_*``,
``on_*dupl*``, ``unique_on``, a near miss of a per-call name, celery-once's ``once``)
but is not a per-call option raises ``ConfigurationError`` at the call; so does such a
name set on a task class that is not an option (``lock_tll=5`` at definition:
:func:`check_unknown_options`).
Celery itself silently ignores unknown ``apply_async`` keywords.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ...errors import ConfigurationError
from ..config import check_on_duplicate, check_ttl
from ..literals import OnDuplicate

__all__ = [
    "BYPASS_HEADER",
    "LOCK_TTL_HEADER",
    "PER_CALL",
    "CallOptions",
    "check_unknown_options",
    "call_options",
    "looks_like_ours",
    "run_lock_ttl",
]

PER_CALL: Final = ("on_duplicate", "singleton", "lock_ttl", "lock_queued_ttl")
"""The options ``apply_async`` takes per call."""

BYPASS_HEADER: Final = "redislock_bypass"
"""Header: ``singleton=False`` was given for this call; its run takes no lock either."""

LOCK_TTL_HEADER: Final = "redislock_lock_ttl"
"""Header: the per-call ``lock_ttl`` (seconds, as a string) of this call's run."""

_PREFIXES: Final = ("lock_", "singleton_", "concurrency_", "redislock_")
_NAMES: Final = frozenset({"once", "unique_on", "on_running_duplicate", "singleton"})


def looks_like_ours(name: str) -> bool:
    """True for an option name of this package's families (see the module doc), or
    one a letter or two away from a per-call option (``singelton``)."""
    return (
        name.startswith(_PREFIXES)
        or name in _NAMES
        or (name.startswith("on_") and "dupl" in name)
        or bool(difflib.get_close_matches(name, PER_CALL, n=1, cutoff=0.8))
    )


@dataclass(frozen=True)
class CallOptions:
    """The per-call options of one ``apply_async`` (None: the task's)."""

    on_duplicate: OnDuplicate | None = None
    singleton: bool | None = None
    lock_ttl: float | None = None
    queued_ttl: float | None = None


NO_CALL_OPTIONS: Final = CallOptions()


def _task_name(task: Any) -> str:
    return str(getattr(task, "name", None) or "?")


def call_options(
    task: Any,
    options: dict[str, Any],
    on_duplicate: object = None,
    singleton: object = None,
    lock_ttl: object = None,
    lock_queued_ttl: object = None,
) -> CallOptions:
    """The checked per-call options of one ``apply_async``; raise for a name among the
    other ``options`` that looks like ours (see the module doc)."""
    for name in options:
        if looks_like_ours(name):
            hint = (
                " (celery-once's per-call options: use on_duplicate=, lock_queued_ttl=)"
                if name == "once"
                else ""
            )
            raise ConfigurationError(
                f"{_task_name(task)}.apply_async(): unknown per-call option "
                f"{name}={options[name]!r}{hint}; per-call options are {', '.join(PER_CALL)}"
            )
    if (
        on_duplicate is None
        and singleton is None
        and lock_ttl is None
        and (lock_queued_ttl is None)
    ):
        return NO_CALL_OPTIONS  # the usual call
    try:
        if on_duplicate is not None:
            check_on_duplicate(on_duplicate)
        if singleton is not None and not isinstance(singleton, bool):
            raise ConfigurationError(f"singleton must be True, False or None, got {singleton!r}")
        if singleton is True and not getattr(task, "singleton", False):
            raise ConfigurationError(
                "singleton=True cannot switch the lock on for one call of a task that is "
                "not a singleton (set the task option singleton=True)"
            )
        return CallOptions(
            on_duplicate=on_duplicate,  # type: ignore[arg-type]  # checked above
            singleton=singleton,
            lock_ttl=None if lock_ttl is None else check_ttl(lock_ttl, "lock_ttl"),
            queued_ttl=(
                None if lock_queued_ttl is None else check_ttl(lock_queued_ttl, "lock_queued_ttl")
            ),
        )
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{_task_name(task)}.apply_async(): per-call option {exc}"
        ) from None


def run_lock_ttl(headers: Any, default: float) -> float:
    """The running lease time of a run: its call's ``lock_ttl`` (a header), else
    ``default`` (the task's)."""
    value = headers.get(LOCK_TTL_HEADER) if headers else None
    if value is None:
        return default
    try:
        return check_ttl(float(value), "lock_ttl")
    except (TypeError, ValueError):  # a foreign producer's header: the task's own
        return default


def check_unknown_options(task_name: str, names: Iterable[str], known: Iterable[str]) -> None:
    """Raise ``ConfigurationError`` for a name among ``names`` (the attributes of a
    task class) that looks like ours (see the module doc) but is not in ``known``."""
    allowed = frozenset(known)
    for name in names:
        if looks_like_ours(name) and name not in allowed and not name.startswith("_"):
            raise ConfigurationError(
                f"task {task_name!r}: unknown option {name!r} (a typo?); the options "
                f"are {', '.join(sorted(n for n in allowed if looks_like_ours(n)))}"
            )
