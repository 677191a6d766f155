"""State of ours kept beside a Celery request, never on it.

Celery hands a run its request as a ``celery.app.task.Context`` (``task.request``): a
new one per run, pushed on the task's ``request_stack`` by the tracer and popped when
the run ends, in the worker as in ``apply()``. What a run of ours must remember -- its
:class:`~.execution.RunState`, the park token of a park whose reply was lost
(:mod:`.bounded.parking`), the owner its rate takes send (:mod:`.ratelimit.guard`) --
belongs to that one Context:

* not on it: an attribute of ours on another library's object (#30), and Celery fills
  the Context's attributes from the message's headers, so ours would share a namespace
  with whatever a message carries;
* not under the task id: ``retry()`` in eager mode runs the next attempt inside the
  current one under the same id (with a Context of its own), and a second delivery of
  an id may run beside the first in a thread pool.

A :class:`RequestSlot` maps a Context to one value, weakly: the value goes with the
Context when Celery drops it at the end of the run, so nothing is cleaned up by hand,
nothing outlives the run, and no run sees another's value -- in a prefork child, a
thread, a greenlet (each has its own Contexts), and in eager mode. A Context is a
plain object (weak-referenceable, hashed by identity). Each access is one dict
operation, atomic under the GIL; the removal runs in whichever thread drops the Context.

Celery copies a request in one place: ``Task.__call__`` (a direct call ``task(...)``
inside a body) pushes a new Context made of the current one's attributes. The direct
call runs in the same request, so it sees the same values of ours: ``RedisLockTask``'s
``push_request`` calls :func:`inherit`.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Final, Generic, TypeVar

from celery.app.task import Context

__all__ = ["RequestSlot", "inherit", "kept"]

T = TypeVar("T")


class _Slot(ABC):
    """What :func:`inherit` and :func:`kept` need of every slot, whatever its type."""

    @abstractmethod
    def copy(self, outer: Context, inner: Context) -> None:
        """Keep beside ``inner`` what is kept beside ``outer``."""

    @abstractmethod
    def __len__(self) -> int: ...


_slots: Final[list[_Slot]] = []


class RequestSlot(_Slot, Generic[T]):
    """One value of type ``T`` per Celery request, kept as long as the request lives.

    Made once, at import (a module's constant); ``name`` says what it holds, for a
    reader and in ``repr``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._values: weakref.WeakKeyDictionary[Context, T] = weakref.WeakKeyDictionary()
        _slots.append(self)

    def get(self, request: Context | None) -> T | None:
        """The value kept beside ``request``, None if there is none (or no request)."""
        return None if request is None else self._values.get(request)

    def set(self, request: Context, value: T) -> None:
        """Keep ``value`` beside ``request`` (replacing any earlier one)."""
        self._values[request] = value

    def copy(self, outer: Context, inner: Context) -> None:
        value = self._values.get(outer)
        if value is not None:
            self._values[inner] = value

    def __len__(self) -> int:
        """The requests alive that have a value here."""
        return len(self._values)

    def __repr__(self) -> str:
        return f"<RequestSlot {self.name!r}: {len(self)} live>"


def inherit(outer: Context, inner: Context) -> None:
    """``inner`` was pushed as a copy of ``outer`` (``Task.push_request``): it sees
    every value kept beside ``outer``, as it sees its attributes."""
    for slot in _slots:
        slot.copy(outer, inner)


def kept() -> int:
    """How many values all slots keep, beside requests still alive (for tests: it falls
    back as runs end)."""
    return sum(len(slot) for slot in _slots)
