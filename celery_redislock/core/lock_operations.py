"""The operator's side of a :class:`~.lock.RedisLock`: release by owner or by force,
``locked()`` and ``info()``; and a lease's release judged by its deadline (a mixin,
so lock.py keeps acquiring and leases).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ConfigurationError
from .info import PrimitiveInfo
from .kept import sees_resends
from .keys import KeySpace
from .lock_scripts import (
    INFO,
    NO_RECORD,
    RELEASE,
    RELEASE_OWNER,
    LockScripts,
    info_reply,
    release_reply,
)

__all__ = ["LockOperations"]


class _Lock(Protocol):
    """What these methods use of the lock they are mixed into."""

    _client: Any
    _keys: KeySpace
    _scripts: LockScripts

    @property
    def name(self) -> str: ...

    def _release_owner(self, owner: str) -> int: ...

    def _release_token(self, token: str) -> bool: ...


class LockOperations:
    """Operations for operators and tools, mixed into :class:`~.lock.RedisLock`."""

    def release_owner(self: _Lock, owner: str) -> int:
        """Release every lease of the lock if its owner id is ``owner``.

        For code that knows the owner but holds no lease (an operator, a process that
        cleans up after a dead one). Returns the number of leases released.
        """
        if not isinstance(owner, str) or not owner:
            raise ConfigurationError(f"owner must be a non-empty string, got {owner!r}")
        return self._release_owner(owner)

    def force_release(self: _Lock) -> int:
        """Release the lock whoever holds it; returns the number of leases released.

        The holders' leases report themselves lost at their next renewal, release or
        extend. Meant for operators clearing a stuck lock, never for normal flow.
        """
        return self._release_owner("")

    def _release_owner(self: _Lock, owner: str) -> int:
        return int(RELEASE_OWNER(self._client, *self._scripts.release_owner_call(owner)))

    def locked(self: _Lock) -> bool:
        """True while any lease holds the lock."""
        return bool(self._client.exists(self._keys.holders))

    def info(self: _Lock) -> PrimitiveInfo:
        """The lock's holders, owner, fence and number of waiters, read-only."""
        return info_reply(
            self.name, INFO(self._client, self._scripts.info_keys, LockScripts.info_args())
        )

    def _release_lease(self: _Lock, token: str, deadline: float) -> bool:
        """``Lease.release`` of lease ``token`` whose local deadline is ``deadline``: on
        a plain client the common release writes no record for a re-send, which judges
        a lease found gone by the deadline instead (see :func:`.release_reply`)."""
        if not sees_resends(self._client):
            return self._release_token(token)  # re-sent by redis-py, unseen: a record
        sends: list[None] = []
        answer = RELEASE(
            self._client, self._scripts.release_call(token), [token, NO_RECORD], sends=sends
        )
        return release_reply(answer, sends, deadline)
