"""``IdentityCache``: a per-object cache (tasks, apps) for the per-call hot paths.

``weakref.WeakKeyDictionary`` makes a weak reference on every lookup (about 2 µs,
and a task call reads several such caches). This cache is a plain dict keyed by
``id(obj)`` whose entries hold the object weakly and are checked to still be it, so
a lookup costs one dict access; an entry goes when its object is collected.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["IdentityCache"]

_V = TypeVar("_V")


class IdentityCache(Generic[_V]):
    """Values keyed by object identity, holding the objects weakly.

    Thread-safe under the GIL: each operation is one dict access. An object that
    cannot be weakly referenced is never cached (:meth:`set` does nothing).
    """

    def __init__(self) -> None:
        self._data: dict[int, tuple[weakref.ref[Any], _V]] = {}

    def get(self, obj: object) -> _V | None:
        """The value cached for ``obj``, or None."""
        entry = self._data.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None

    def set(self, obj: object, value: _V) -> None:
        """Cache ``value`` for ``obj`` (replacing any earlier value)."""
        key = id(obj)
        data = self._data

        def forget(ref: weakref.ref[Any]) -> None:
            # Only our own entry: the id may belong to a newer object by now.
            entry = data.get(key)
            if entry is not None and entry[0] is ref:
                data.pop(key, None)

        with contextlib.suppress(TypeError):  # not weakly referable: not cached
            data[key] = (weakref.ref(obj, forget), value)

    def clear(self) -> None:
        """Forget every entry."""
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
