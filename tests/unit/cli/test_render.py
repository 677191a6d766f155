"""The CLI's pure parts: key parsing, owner matching, tables and durations (no Redis)."""

from __future__ import annotations

import pytest

from celery_redislock.celery.cli.render import format_duration, render_entry, render_list, table
from celery_redislock.core.inventory import (
    Entry,
    Holder,
    _glob_escape,
    _parse_key,
    matching_owners,
)
from celery_redislock.core.keys import KeySpace


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.04, "0.0s"),
        (-1, "0.0s"),
        (12.34, "12.3s"),
        (59.9, "59.9s"),
        (65, "1m05s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (7322, "2h02m"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_table_aligns_columns_and_trims_trailing_blanks() -> None:
    assert table(("A", "LONG"), [["xyz", ""], ["", "b"]]) == "A    LONG\nxyz\n     b"


@pytest.mark.parametrize("name", ["plain", "a:b:{c}", "100% {x}", "}{", "a}:holders"])
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_parse_key_inverts_the_key_space(name: str, kind: str) -> None:
    keys = KeySpace.build("p:x", kind, name)
    assert _parse_key(keys.holders, "p:x", "holders") == (kind, name)
    assert _parse_key(keys.queue, "p:x", "queue") == (kind, name)
    assert _parse_key(keys.holders, "p", "holders") is None  # another prefix
    assert _parse_key(keys.fence, "p:x", "holders") is None


@pytest.mark.parametrize(
    "key", ["p:other:{a}:holders", "p:lock:a:holders", "p:lock:{}:holders", "p:lock:{a{b}:holders"]
)
def test_parse_key_ignores_foreign_keys(key: str) -> None:
    assert _parse_key(key, "p", "holders") is None


def test_glob_escape() -> None:
    assert _glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"


def _holder(owner: str | None, task_id: str | None, state: str | None) -> Holder:
    return Holder(owner, task_id, state, 12.5, 7, "abcdef12")


def test_matching_owners_by_owner_id_or_task_id() -> None:
    entry = Entry(
        "semaphore",
        "s",
        (
            _holder("t1@0123456789ab", "t1", "running"),
            _holder("t1#0123456789ac", "t1", "queued"),
            _holder("plain", "plain", None),
            _holder(None, None, None),
        ),
        0,
        3,
        None,
        None,
    )
    assert matching_owners(entry, "t1") == ["t1@0123456789ab", "t1#0123456789ac"]
    assert matching_owners(entry, "t1#0123456789ac") == ["t1#0123456789ac"]
    assert matching_owners(entry, "plain") == ["plain"]
    assert matching_owners(entry, "t") == []


def test_render_list_and_entry() -> None:
    free = Entry("lock", "waited", (), 2, None, None, None)
    sem = Entry(
        "semaphore",
        "api",
        (_holder("t1@0123456789ab", "t1", "running"), _holder(None, None, None)),
        0,
        None,
        100.0,
        7,
    )
    listed = render_list([free, sem]).splitlines()
    assert listed[1].split() == ["lock", "waited", "free", "2", "-", "-", "-", "-", "-"]
    assert listed[2].split() == ["semaphore", "api", "2/-", "0", "0", "t1", "running", "12.5s", "7"]
    assert listed[3].split() == ["-", "-", "12.5s", "7"]
    backlog = Entry("semaphore", "api", (), 0, 2, None, None, parked=3, oldest_parked=12.0, dead=1)
    assert render_list([backlog]).splitlines()[1].split()[4:9] == [
        "3",
        "(oldest",
        "12.0s)",
        "+1",
        "dead",
    ]
    dead_view = render_entry(backlog, prefix="redislock", dead_letters=[("abc", 0.0, "bad")])
    assert "parked    3 (oldest 12.0s) +1 dead" in dead_view
    assert "abc  1970-01-01 00:00:00 UTC  bad" in dead_view
    view = render_entry(sem, prefix="redislock", now=112.5)
    assert "2 leases of an unknown limit; 0 waiters" in view
    assert "since     1970-01-01 00:01:40 UTC (12.5s ago)" in view
    lock_view = render_entry(
        Entry("lock", "l", (_holder(None, None, None),), 1, None, None, 3), prefix="redislock"
    )
    assert "owner     (none given)" in lock_view and "1 lease; 1 waiter" in lock_view
