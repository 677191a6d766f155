"""The operator's side of a :class:`~.lock.RedlockLock`: release by owner or by force,
and each master's view of the lock (a mixin, so lock.py keeps the lock's own logic).
"""

from __future__ import annotations

import secrets
from typing import Protocol

from ...errors import ConfigurationError
from ..info import PrimitiveInfo
from ..keys import KeySpace
from ..lock import RedisLock
from . import rounds
from .masters import Master

__all__ = ["RedlockOperations"]


class _Lock(Protocol):
    """What these methods use of the lock they are mixed into."""

    quorum: int
    _masters: list[Master]
    _queue_keys: list[bytes]
    _keys: KeySpace
    _timeout: float

    @property
    def name(self) -> str: ...

    def _release_owner(self, owner: str) -> int: ...

    def info_by_master(self) -> dict[str, PrimitiveInfo | Exception]: ...


class RedlockOperations:
    """Operations for operators and tools, mixed into :class:`~.lock.RedlockLock`."""

    def release_owner(self: _Lock, owner: str) -> int:
        """Release the lock on every master where its owner id is ``owner``; returns
        the number of masters where leases were released."""
        if not isinstance(owner, str) or not owner:
            raise ConfigurationError(f"owner must be a non-empty string, got {owner!r}")
        return self._release_owner(owner)

    def force_release(self: _Lock) -> int:
        """Release the lock on every master, whoever holds it (for operators)."""
        return self._release_owner("")

    def _release_owner(self: _Lock, owner: str) -> int:
        nonce = secrets.token_hex(16)  # this call's: a re-send gets the same count
        replies = rounds.run_each(
            self._masters,
            list(range(len(self._masters))),
            rounds.RELEASE_OWNER,
            [*self._queue_keys, self._keys.done(nonce).encode()],
            [nonce, owner],
            self._timeout,
        )
        return sum(
            1
            for reply in replies.values()
            if not isinstance(reply, BaseException) and int(reply) > 0
        )

    def locked(self: _Lock) -> bool:
        """True while a majority of the masters hold the lock."""
        return (
            sum(
                1
                for info in self.info_by_master().values()
                if isinstance(info, PrimitiveInfo) and info.holders
            )
            >= self.quorum
        )

    def info_by_master(self: _Lock) -> dict[str, PrimitiveInfo | Exception]:
        """Each master's view of the lock (``host:port`` -> its info, or the error)."""
        views: dict[str, PrimitiveInfo | Exception] = {}
        for master in self._masters:
            try:
                views[master.label] = RedisLock(
                    master.client, self.name, prefix=self._keys.prefix
                ).info()
            except Exception as exc:  # a master down is part of the picture
                views[master.label] = exc
        return views
