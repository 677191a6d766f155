"""Per-call options of ``apply_async`` and the check that catches option typos.

``task.apply_async(args, on_duplicate="raise")``, ``singleton=False`` (this call takes
no singleton lock, and its run does not either), ``lock_ttl=`` (the running lease of
this call's run: singleton lock and concurrency permit) and ``lock_queued_ttl=`` (this
call's queued lease). Also through ``sig.set(...)`` and canvases. They are taken out
of the options before Celery sees them; what the worker needs travels in headers that
``retry()`` and re-sends keep.

A name that looks like one of ours but is none raises ``ConfigurationError``: one of
our families (``lock_*``, ``singleton_*``, ``concurrency_*``, ``redislock_*``,
``on_*dupl*``, celery-once's ``once``), or one close to any option name of ours
(``concurency_key``, ``unique_onn``, ``singelton_mode``: :func:`resembles`, #29 item 2).
At the call for ``apply_async`` keywords; at definition for a task's options, however
set (decorator keyword, ``@app.task(base=...)``, subclass attribute,
``task_annotations``: :func:`check_unknown_options`). Celery's own option names never
count (:data:`CELERY_NAMES`), and Celery itself silently ignores unknown keywords.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from celery import Celery, Task
from kombu import Producer

from ...errors import ConfigurationError
from ..bounded.options import OPTIONS as BOUNDED_OPTIONS
from ..config import check_on_duplicate, check_ttl
from ..literals import OnDuplicate
from ..ratelimit.options import OPTIONS as RATE_OPTIONS
from .options import OPTIONS as SINGLETON_OPTIONS

__all__ = [
    "BYPASS_HEADER",
    "LOCK_TTL_HEADER",
    "CELERY_NAMES",
    "OUR_NAMES",
    "PER_CALL",
    "CallOptions",
    "check_unknown_options",
    "call_options",
    "looks_like_ours",
    "resembles",
    "run_lock_ttl",
]

PER_CALL: Final = ("on_duplicate", "singleton", "lock_ttl", "lock_queued_ttl")
"""The options ``apply_async`` takes per call."""

BYPASS_HEADER: Final = "redislock_bypass"
"""Header: ``singleton=False`` was given for this call; its run takes no lock either."""

LOCK_TTL_HEADER: Final = "redislock_lock_ttl"
"""Header: the per-call ``lock_ttl`` (seconds, as a string) of this call's run."""

OUR_NAMES: Final = tuple(
    dict.fromkeys(
        (*SINGLETON_OPTIONS, *BOUNDED_OPTIONS, *RATE_OPTIONS, *PER_CALL, "concurrency_limit")
    )
)
"""Every option name of ours: task options, decorator keywords, per-call options."""

# apply_async / send_task / Producer.publish keywords that are not Task attributes
# and @app.task keywords (celery 5.6-5.7, kombu 5.6-5.7); the signatures below add
# whatever a later version has.
_CELERY_CALL_OPTIONS: Final = (
    "add_to_parent",
    "argsrepr",
    "chain",
    "chord",
    "compression",
    "connection",
    "content_encoding",
    "content_type",
    "correlation_id",
    "countdown",
    "declare",
    "delivery_mode",
    "eta",
    "exchange",
    "exchange_type",
    "expiration",
    "expires",
    "group_id",
    "group_index",
    "headers",
    "ignore_result",
    "immediate",
    "kwargsrepr",
    "link",
    "link_error",
    "mandatory",
    "origin",
    "parent_id",
    "priority",
    "producer",
    "publisher",
    "queue",
    "replaced_task_nesting",
    "reply_to",
    "retries",
    "retry",
    "retry_policy",
    "root_id",
    "route_name",
    "router",
    "routing_key",
    "serializer",
    "shadow",
    "soft_time_limit",
    "stamped_headers",
    "stamps",
    "task_id",
    "task_type",
    "taskset",
    "time_limit",
    "timeout",
    "timeouts",
    "base",
    "bind",
    "filter",
    "lazy",
    "shared",
    "pydantic",
    "pydantic_strict",
    "pydantic_context",
    "pydantic_dump_kwargs",
)


def _parameters(*functions: Callable[..., object]) -> set[str]:
    return {name for f in functions for name in inspect.signature(f).parameters}


CELERY_NAMES: Final = frozenset(
    {*dir(Task), *_CELERY_CALL_OPTIONS}
    | _parameters(Task.apply_async, Celery.send_task, Celery.task, Producer.publish)
) - frozenset(OUR_NAMES)
"""Celery's (and kombu's) own task attributes and call options: never a typo of ours."""

_CUTOFF: Final = 0.8  # difflib ratio: one or two letters off a name of 8+ letters
_PREFIXES: Final = ("lock_", "singleton_", "concurrency_", "redislock_")
_NAMES: Final = frozenset({"once", "unique_on", "on_running_duplicate", "singleton"})


def resembles(name: str) -> str | None:
    """The option name of ours that ``name`` is close to but is not (a typo:
    ``concurency_key`` -> ``concurrency_key``), or None. Celery's own names and
    private (``_``) names are never typos."""
    if name in CELERY_NAMES or name.startswith("_") or name in OUR_NAMES:
        return None
    close = difflib.get_close_matches(name, OUR_NAMES, n=1, cutoff=_CUTOFF)
    return close[0] if close else None


def looks_like_ours(name: str) -> bool:
    """True for an option name of this package's families (see the module doc), or
    one close to any option name of ours (:func:`resembles`)."""
    return (
        name.startswith(_PREFIXES)
        or name in _NAMES
        or (name.startswith("on_") and "dupl" in name)
        or resembles(name) is not None
    )


def _did_you_mean(name: str) -> str:
    close = resembles(name) or next(iter(difflib.get_close_matches(name, OUR_NAMES, 1, 0.6)), None)
    return f" (a typo of {close!r}?)" if close else " (a typo?)"


@dataclass(frozen=True)
class CallOptions:
    """The per-call options of one ``apply_async`` (None: the task's)."""

    on_duplicate: OnDuplicate | None = None
    singleton: bool | None = None
    lock_ttl: float | None = None
    queued_ttl: float | None = None


NO_CALL_OPTIONS: Final = CallOptions()


def _task_name(task: object) -> str:
    return str(getattr(task, "name", None) or "?")


def call_options(
    task: object,
    options: dict[str, Any],
    on_duplicate: object = None,
    singleton: object = None,
    lock_ttl: object = None,
    lock_queued_ttl: object = None,
) -> CallOptions:
    """The checked per-call options of one ``apply_async``; raise for a name among the
    other ``options`` that looks like ours (see the module doc)."""
    for name in options:
        if name in OUR_NAMES:
            # One of our task options, given to one call: Celery would pass it on as a
            # message property, ignored (global_rate_limit=), and it is no typo.
            raise ConfigurationError(
                f"{_task_name(task)}.apply_async(): {name}={options[name]!r} is a task "
                "option, not a per-call option: set it on the task (its decorator, "
                "@app.task(...), a subclass or task_annotations); per-call options are "
                f"{', '.join(PER_CALL)}"
            )
        if looks_like_ours(name):
            hint = (
                " (celery-once's per-call options: use on_duplicate=, lock_queued_ttl=)"
                if name == "once"
                else ""
            )
            raise ConfigurationError(
                f"{_task_name(task)}.apply_async(): unknown per-call option "
                f"{name}={options[name]!r}{hint or _did_you_mean(name)}; per-call options "
                f"are {', '.join(PER_CALL)}"
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
                f"task {task_name!r}: unknown option {name!r}{_did_you_mean(name)}; the "
                f"options are {', '.join(sorted(n for n in allowed if n in OUR_NAMES))}"
            )
