"""A task's options and its app's settings, resolved once: :class:`TaskOptions`.

Every path that needs them -- ``apply_async``, a run's guards, the main process's
cleanup -- calls :func:`options_of` and reads attributes; nothing on those paths asks
the configuration again. The object is built (validated, merged with the app's
``redislock_*`` settings) the first time, then kept on the task until the task's raw
option values or the app's settings fingerprint change, so ``task_annotations``,
``app.conf.update`` and options set on the class or the instance later still count.
It also carries what the hot paths keep between calls: the keys of recent calls and
the lock objects (``SingletonOptions.call_keys`` and ``.locks``), which go with it.

What each option means and how it is checked: :mod:`.singleton.options` and
:mod:`.bounded.options`; the settings: :mod:`.config`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from celery import Celery
from celery.local import Proxy

from .bounded.options import OPTIONS as BOUNDED_OPTIONS
from .bounded.options import BoundedOptions, check_bounded_options, resolve_bounded
from .bounded.settings import SETTINGS as BOUNDED_SETTINGS
from .client import replica_options
from .config import SETTINGS_KEYS, restart_grace, settings_for, task_option
from .redlock import redlock_max_ttl
from .singleton.options import OPTIONS as SINGLETON_OPTIONS
from .singleton.options import SingletonOptions, check_singleton_options, resolve_singleton
from .upstream import conf_fingerprint

if TYPE_CHECKING:
    from .execution import AnyTask

__all__ = ["OPTIONS", "SETTINGS", "TaskOptions", "check_class_options", "options_of"]

OPTIONS: Final = (*SINGLETON_OPTIONS, *BOUNDED_OPTIONS)
"""Every task option of this package."""

SETTINGS: Final = (*SETTINGS_KEYS, *BOUNDED_SETTINGS)
"""Every setting the options are resolved from (the client's included)."""


@dataclass(frozen=True)
class TaskOptions:
    """The validated options of one task under one state of its app's settings."""

    singleton: SingletonOptions
    """The singleton lock: on or off, mode, TTLs, duplicates, key builder, prefix."""
    bounded: BoundedOptions
    """Bounded concurrency: limit, pool, re-scheduling (``enabled`` False: none)."""


_ATTRIBUTE: Final = "_redislock_options"  # on the task: (raw options, fingerprint, options)
_NAMES: Final = frozenset(OPTIONS)
# One C call reads every option off the class (where Celery puts them; a function
# stays unbound there): a task_option() per name costs ten times more.
_read_class: Final = operator.attrgetter(*OPTIONS, "__class__")


def options_of(task: AnyTask) -> TaskOptions:
    """The task's options now: its own, else its app's settings (see the module docs).

    Raises :class:`~celery_redislock.errors.ConfigurationError` naming the option or
    setting and its value when one is bad.
    """
    if isinstance(task, Proxy):  # @app.task gives a lazy proxy until the app finalizes
        task = task._get_current_object()
    own = task.__dict__
    try:
        if not own.keys().isdisjoint(_NAMES):  # options set on the instance
            raise AttributeError
        raw: object = _read_class(type(task))
    except AttributeError:  # or a task of another base class, without our options
        raw = tuple(task_option(task, name) for name in OPTIONS)
    app = task.app
    fingerprint = conf_fingerprint(app, SETTINGS)
    cached = own.get(_ATTRIBUTE)
    if cached is not None and cached[1] == fingerprint and cached[0] == raw:
        return cached[2]  # type: ignore[no-any-return]
    singleton, bounded = resolve_singleton(task, settings_for(app)), resolve_bounded(task)
    if singleton.enabled or bounded.enabled:  # they take locks or permits: on what terms
        singleton = replace(
            singleton,
            replicas=replica_options(app),
            redlock_max_ttl=_redlock_ttl(app, singleton),
            restart_grace=restart_grace(app),
        )
    options = TaskOptions(singleton, bounded)
    if fingerprint is not None:  # None: the configuration is not loaded yet
        own[_ATTRIBUTE] = (raw, fingerprint, options)
    return options


def _redlock_ttl(app: Celery, singleton: SingletonOptions) -> float | None:
    if app.conf.get("redislock_urls") is None:
        return None
    return max(redlock_max_ttl(app, singleton.queued_ttl), singleton.lock_ttl)


def check_class_options(task: object) -> None:
    """Validate the options set on a task (class or instance); raise if one is bad.

    Run when a task is bound to its app and by the decorators, so a bad value fails
    when the task is defined; the settings are checked when first used.
    """
    check_singleton_options(task)
    check_bounded_options(task)
