"""The canonical encoding: deterministic, and distinct values never collide."""

from __future__ import annotations

import datetime
import decimal
import itertools
import pickle
import uuid
from typing import Any

import pytest

from celery_redislock.celery.singleton.canonical import UNSET, canonical_json, digest

DISTINCT: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    1.0,
    -0.5,
    "",
    "1",
    "l",
    "b",
    "00",
    [],
    ["b", "00"],
    ["l"],
    [1],
    [[1]],
    [1, 2],
    [2, 1],
    {},
    {"a": 1},
    {"a": "1"},
    {1: "a"},
    {"1": "a"},
    [["a", 1]],
    {"d": []},
    b"",
    b"\x00",
    bytearray(b"\x01"),
    {1, 2},
    frozenset({3}),
    datetime.datetime(2024, 1, 2),
    datetime.date(2024, 1, 2),
    datetime.time(1, 2),
    decimal.Decimal("1.10"),
    decimal.Decimal("1.1"),
    uuid.UUID(int=1),
    str(uuid.UUID(int=1)),
    UNSET,
    ["unset"],
    "UNSET",
]


def test_distinct_values_encode_distinctly() -> None:
    encodings = [canonical_json(value) for value in DISTINCT]
    for (a, ea), (b, eb) in itertools.combinations(zip(DISTINCT, encodings, strict=True), 2):
        assert ea != eb, (a, b)


def test_order_of_dicts_and_sets_does_not_matter() -> None:
    assert canonical_json({"a": 1, "b": [1, {"y": 2, "x": 1}]}) == canonical_json(
        {"b": [1, {"x": 1, "y": 2}], "a": 1}
    )
    assert canonical_json({3, 1, 2}) == canonical_json({2, 3, 1})
    assert canonical_json({1: "a", "1": "b"}) == canonical_json({"1": "b", 1: "a"})


def test_tuples_encode_as_lists() -> None:
    assert canonical_json((1, (2, 3))) == canonical_json([1, [2, 3]])


def test_objects_without_a_stable_form_are_refused() -> None:
    with pytest.raises(TypeError, match="no canonical form for a object value"):
        canonical_json([1, object()])


def test_digest_is_bounded_hex() -> None:
    value = {"user": "alice@example.com", "blob": "x" * 10_000}
    assert len(digest(value)) == 32
    assert len(digest(value, 16)) == 16
    assert digest(value) == digest(dict(reversed(list(value.items()))))
    assert "alice" not in digest(value)
    int(digest(value), 16)


def test_unset_survives_pickle() -> None:
    # A pickle-serialized task round-trips UNSET (an absent **kwargs name) in one piece.
    assert pickle.loads(pickle.dumps({"a": UNSET}))["a"] is UNSET
