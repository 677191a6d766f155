"""A canonical encoding of argument values, and its bounded, opaque digest.

Two calls are the same job exactly when their arguments encode to the same bytes, so
the encoding must be deterministic (dict and set order never matter) and injective
(values of different types never collide). Every container is written as a JSON list
whose first item is a type tag (``["l", ...]`` for a list, ``["d", [k, v], ...]`` for
a dict); scalars stay plain JSON, and no scalar is ever a list, so a tag cannot be
forged by data. Lists and tuples share a tag: a serializer may turn one into the
other, and callers do not mean different jobs by them.

Only a truncated SHA-256 of the encoding reaches Redis: arguments may hold personal
data, and a key must stay short whatever the arguments' size.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import uuid
from typing import Any, Final

__all__ = ["DIGEST_LENGTH", "UNSET", "canonical_json", "digest"]

DIGEST_LENGTH: Final = 32
"""Hex characters of the digest kept: 128 bits, far beyond any accidental collision."""


class _Unset:
    """Type of :data:`UNSET`."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"  # pickle restores the singleton, so a round trip keeps it UNSET


UNSET: Final = _Unset()
"""Stands for "no value": an unset ``**kwargs`` name, or a default that cannot be
encoded (a sentinel ``object()``); it is equal on the producer and the worker alike."""


def _tree(value: object) -> Any:
    # bool before int, datetime before date: each is a subclass of the latter.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        # Subclasses such as IntEnum encode as the plain number they stand for.
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, (list, tuple)):
        return ["l", *(_tree(item) for item in value)]
    if isinstance(value, dict):
        pairs = [[_tree(key), _tree(item)] for key, item in value.items()]
        if all(type(key) is str for key in value):  # the usual case, sorted cheaply
            return ["d", *sorted(pairs, key=lambda pair: pair[0])]
        return ["d", *sorted(pairs, key=lambda pair: _dumps(pair[0]))]
    if isinstance(value, (set, frozenset)):
        return ["s", *sorted((_tree(item) for item in value), key=_dumps)]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ["b", bytes(value).hex()]
    if isinstance(value, datetime.datetime):
        return ["dt", value.isoformat()]
    if isinstance(value, (datetime.date, datetime.time)):
        return [type(value).__name__, value.isoformat()]
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return [type(value).__name__, str(value)]
    if value is UNSET:
        return ["unset"]
    # repr() or pickle of an arbitrary object is not stable across processes.
    raise TypeError(f"no canonical form for a {type(value).__qualname__} value")


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def canonical_json(value: object) -> str:
    """Return the canonical encoding of ``value`` as a JSON string.

    Raises:
        TypeError: ``value`` holds an object with no stable encoding (anything but
            JSON types, tuples, sets, bytes, date/time, ``Decimal``, ``UUID``).
    """
    return _dumps(_tree(value))


def digest(value: object, length: int = DIGEST_LENGTH) -> str:
    """Return the first ``length`` hex characters of the SHA-256 of ``canonical_json``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]
