"""Key layout: every key of one lock shares one Cluster hash slot, whatever the name."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from celery_redislock.core.keys import KeySpace, decode_name, encode_name

AWKWARD = [
    "plain",
    "a{b}c",
    "}{",
    "{",
    "}",
    "{}",
    "%7B",
    "%7D",
    "%",
    "%25",
    "x{y}z{w}",
    "naïve ☃",
    "with:colons:and spaces",
    "{{}}",
]


def all_keys(space: KeySpace) -> list[str]:
    return [space.holders, space.fence, space.queue, space.alive, space.meta]


def test_key_slot_matches_redis_documentation() -> None:
    # The examples of https://redis.io/commands/cluster-keyslot/: the helper is right.
    assert key_slot(b"somekey") == 11058
    assert key_slot(b"foo{hash_tag}") == key_slot(b"bar{hash_tag}") == 2515


@pytest.mark.parametrize("name", AWKWARD)
def test_all_keys_of_a_lock_share_one_slot(name: str) -> None:
    space = KeySpace.build("redislock", "lock", name)
    slots = {key_slot(key.encode("utf-8")) for key in all_keys(space)}
    assert len(slots) == 1, (name, all_keys(space))
    # ... and the slot is the one of the encoded name alone: the tag is the whole name.
    assert slots == {key_slot(encode_name(name).encode("utf-8"))}


@pytest.mark.parametrize("name", AWKWARD)
def test_the_hash_tag_holds_exactly_the_encoded_name(name: str) -> None:
    base = KeySpace.build("redislock", "lock", name).base
    assert base == "redislock:lock:{" + encode_name(name) + "}"
    inner = base[len("redislock:lock:{") : -1]
    assert "{" not in inner and "}" not in inner
    assert decode_name(inner) == name


def test_encoding_is_injective_on_awkward_names() -> None:
    encoded = [encode_name(name) for name in AWKWARD]
    assert len(set(encoded)) == len(AWKWARD)
    assert encode_name("{") != encode_name("%7B")


def test_lock_and_semaphore_of_one_name_do_not_share_keys() -> None:
    lock = KeySpace.build("redislock", "lock", "x")
    sem = KeySpace.build("redislock", "semaphore", "x")
    assert not set(all_keys(lock)) & set(all_keys(sem))
    assert lock.channel != sem.channel


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
@pytest.mark.parametrize("name", AWKWARD)
def test_the_channel_is_derived_from_the_holders_key(kind: str, name: str) -> None:
    # The scripts are not sent the channel: wake_channel (lib_lock.lua) replaces the
    # holders key's last part "holders" by "wake". The same rule here.
    space = KeySpace.build("p:x", kind, name)
    assert space.holders.endswith(":holders")
    assert space.channel == space.holders[: -len("holders")] + "wake"
