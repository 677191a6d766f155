"""Redis key names for locks and semaphores.

Every key of one lock or semaphore shares one Redis Cluster hash tag, the user's
name between braces, so one Lua script may touch all of them on any cluster node.
A name that itself holds ``{`` or ``}`` would move the hash tag, so those characters
(and ``%``, the escape character) are percent-encoded; :func:`decode_name` reverses it
for the inspection tools.

Layout, for prefix ``redislock`` and kind ``lock``::

    redislock:lock:{name}:holders   hash/zset of live leases (exists iff held)
    redislock:lock:{name}:leases    hash of each live lease's details (semaphore)
    redislock:lock:{name}:fence     last fencing token granted (expires by itself)
    redislock:lock:{name}:queue     zset of waiters by ticket (FIFO order)
    redislock:lock:{name}:alive     zset of waiters by heartbeat deadline
    redislock:lock:{name}:asks      hash of each waiter's request (TTL, owner)
    redislock:lock:{name}:meta      hash of settings stored with the primitive
    redislock:lock:{name}:added     hash of each lease's last ``extend(add=True)``
    redislock:lock:{name}:wake      pub/sub channel: payload is the token to wake

The scripts are not sent the channel: they derive it from the holders key, their
``KEYS[1]``, by replacing its last part ``holders`` with ``wake`` (``wake_channel`` in
``lua/lib_lock.lua``). :attr:`KeySpace.channel` is the same rule on the Python side;
a test holds the two together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

from ..errors import ConfigurationError
from .validate import check_name

__all__ = ["DEFAULT_PREFIX", "KeySpace", "decode_name", "encode_name"]

DEFAULT_PREFIX = "redislock"

_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}


_ESCAPE_TABLE = str.maketrans(_ESCAPES)


def encode_name(name: str) -> str:
    """Percent-encode the characters that would break the hash tag."""
    if "%" in name or "{" in name or "}" in name:
        return name.translate(_ESCAPE_TABLE)
    return name  # the common case: nothing to escape, no copy


def decode_name(encoded: str) -> str:
    """Reverse :func:`encode_name`."""
    return encoded.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


@functools.lru_cache(maxsize=64)
def _check_prefix(prefix: str) -> str:
    """``prefix`` if usable (checked once per prefix: locks are built per call)."""
    check_name(prefix, "prefix")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(f"prefix must not contain '{{' or '}}', got {prefix!r}")
    return prefix


@dataclass(frozen=True)
class KeySpace:
    """The keys and the wake-up channel of one named lock or semaphore."""

    prefix: str
    kind: str
    name: str

    @classmethod
    def build(cls, prefix: str, kind: str, name: str) -> KeySpace:
        """Validate ``prefix`` and ``name`` and return the key space."""
        check_name(name)
        if prefix.__class__ is not str:
            check_name(prefix, "prefix")  # raises (not hashable for the cache, either)
        _check_prefix(prefix)
        space = cls(prefix, kind, name)
        # ``base`` at once, as the cached property would make it: every lock reads it
        # when built, and the property's first read (a lock on Python < 3.12) costs
        # more than the string.
        space.__dict__["base"] = f"{prefix}:{kind}:{{{encode_name(name)}}}"
        return space

    @cached_property
    def base(self) -> str:
        """``prefix:kind:{encoded name}``, the part every key shares."""
        return f"{self.prefix}:{self.kind}:{{{encode_name(self.name)}}}"

    def key(self, part: str) -> str:
        """The key for ``part`` (``holders``, ``fence``, ``queue``, ...)."""
        return f"{self.base}:{part}"

    @property
    def holders(self) -> str:
        """Key of the live leases; exists exactly while the primitive is held."""
        return self.key("holders")

    @property
    def leases(self) -> str:
        """Key of the details (fence, owner, grant time) of a semaphore's leases."""
        return self.key("leases")

    @property
    def fence(self) -> str:
        """Key of the last fencing token granted."""
        return self.key("fence")

    @property
    def queue(self) -> str:
        """Key of the waiters ordered by ticket."""
        return self.key("queue")

    @property
    def alive(self) -> str:
        """Key of the waiters ordered by heartbeat deadline."""
        return self.key("alive")

    @property
    def asks(self) -> str:
        """Key of each waiter's request (TTL and owner), for grants made on release."""
        return self.key("asks")

    @property
    def meta(self) -> str:
        """Key of the settings stored with the primitive (e.g. a semaphore's limit)."""
        return self.key("meta")

    def done(self, id: str) -> str:
        """Key recording that the call or lease ``id`` (a release's token, an adopt's or
        release_owner's nonce) was answered, so a re-send of it gets the same answer."""
        return f"{self.base}:done:{id}"

    @property
    def added(self) -> str:
        """Key of each lease's last ``extend(ttl, add=True)`` (its request id), so a
        re-sent request is recognised rather than adding twice."""
        return self.key("added")

    @property
    def channel(self) -> str:
        """Pub/sub channel on which a release names the waiter token to wake: the
        holders key with its last part ``holders`` replaced by ``wake``, as the scripts
        derive it (``wake_channel`` in lib_lock.lua)."""
        return self.key("wake")
