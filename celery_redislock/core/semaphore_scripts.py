"""The semaphore's Lua scripts (``lua/semaphore_*.lua``), bound to one semaphore.

:class:`SemaphoreScripts` builds each script's KEYS and constant ARGV once, so an
operation costs its one round trip and little else. Wake-ups go to the waiter's own
process: a token ends in ``.<tag>``, the tag of the process that made it, and the
scripts publish it on ``<wake channel>:<tag>``, which only that process listens to
(the scripts derive the channel from the holders key: :attr:`.KeySpace.channel`).
A release grants the permits it frees to the first waiters itself and tells them
``<token> <fence>`` (see ``hand_over_permits`` in lib_semaphore.lua).
"""

from __future__ import annotations

from typing import Any

from .info import HolderInfo, PrimitiveInfo
from .keys import KeySpace
from .lock import SCRIPT_CONSTANTS
from .scripts import LuaScript, as_text

__all__ = ["PATIENCE_MS", "RENEW", "SemaphoreScripts"]

PATIENCE_MS = 2.0
"""Not fair: once the longest waiter has waited this long (ms), newcomers no longer
barge in ahead of the queue, which bounds every wait."""

_ACQUIRE = LuaScript("semaphore_acquire.lua", SCRIPT_CONSTANTS)
_RELEASE = LuaScript("semaphore_release.lua", SCRIPT_CONSTANTS)
_EXTEND = LuaScript("semaphore_extend.lua", SCRIPT_CONSTANTS)
_LEAVE = LuaScript("queue_leave.lua", SCRIPT_CONSTANTS)
_RELEASE_OWNER = LuaScript("semaphore_release_owner.lua", SCRIPT_CONSTANTS)
_INFO = LuaScript("semaphore_info.lua", SCRIPT_CONSTANTS)
_HELD = LuaScript("semaphore_held.lua", SCRIPT_CONSTANTS)
_EXTEND_ADD = LuaScript("semaphore_extend_add.lua", SCRIPT_CONSTANTS)
RENEW = LuaScript("semaphore_renew.lua", SCRIPT_CONSTANTS)
"""The renewer's batch script for semaphore leases (keys: holders, leases)."""


class SemaphoreScripts:
    """The scripts of one semaphore: its keys, limit and fairness baked in; ``channel``
    is its wake-up channel (the scripts derive it from the holders key)."""

    __slots__ = ("_acquire_args", "_acquire_keys", "_add_keys", "_client", "_flags",
                 "_info_keys", "_leave_keys", "_release_keys", "_state_keys",
                 "channel")  # fmt: skip

    def __init__(self, client: Any, keys: KeySpace, limit: int, fair: bool) -> None:
        self._client = client
        self.channel = keys.channel
        # Sent as they are on every call: encoded once, as redis-py would encode them.
        encode = client.get_encoder().encode
        holders, leases, fence, queue, alive, meta, asks = (
            encode(key) for key in (keys.holders, keys.leases, keys.fence, keys.queue,
                                    keys.alive, keys.meta, keys.asks)
        )  # fmt: skip
        self._flags = [b"%d" % limit, b"1" if fair else b"0"]  # limit, fair
        self._acquire_keys = [holders, leases, fence, queue, alive, meta, asks]
        self._acquire_args = [*self._flags, b"%d" % round(PATIENCE_MS * 1000)]
        self._release_keys = [holders, leases, queue, alive, meta, asks, fence]
        self._state_keys = [holders, leases, queue, alive, meta, asks]
        self._leave_keys = [holders, queue, alive, asks, leases]
        self._info_keys = [holders, leases, queue, meta]
        self._add_keys = [holders, leases, encode(keys.added)]

    def acquire(
        self, token: str, owner: str, ttl_ms: int, wait: bool
    ) -> tuple[int, int, int, int]:
        """``(1, fence, previous, ms_left)`` granted, ``(0, wait_ms, previous, 0)`` refused.

        ``previous`` is the limit stored before, when this call changed it, else 0;
        ``ms_left`` the TTL the lease has left (less than ``ttl_ms`` when a release
        had granted it to this waiter already).
        """
        args = [token, ttl_ms, *self._acquire_args, b"1" if wait else b"0"]
        if owner:  # else left out: the script's default
            args.append(owner)
        reply = _ACQUIRE(self._client, self._acquire_keys, args)
        return int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]) if reply[0] else 0

    def release(self, token: str) -> bool:
        """Give the permit of ``token`` back; False when it was not live."""
        return bool(_RELEASE(self._client, self._release_keys, [token, *self._flags]))

    def release_owner(self, owner: str) -> int:
        """Give back every permit whose owner id is ``owner`` ("": every permit);
        the number of live permits released."""
        return int(_RELEASE_OWNER(self._client, self._state_keys, [owner, *self._flags]))

    def extend(self, token: str, ttl_ms: int) -> bool:
        """Reset the permit of ``token`` to ``ttl_ms``; False when it was not live."""
        return bool(_EXTEND(self._client, self._state_keys, [token, ttl_ms, *self._flags]))

    def held(self, token: str) -> int:
        """The ms the permit of ``token`` has left; 0 when it is not live (read-only)."""
        return int(_HELD(self._client, self._add_keys[:1], [token]))

    def extend_add(self, token: str, ttl_ms: int, nonce: str) -> int:
        """Add ``ttl_ms`` to the permit of ``token``; the ms it has left afterwards,
        0 when it was not live. ``nonce`` identifies the request (see the script)."""
        return int(_EXTEND_ADD(self._client, self._add_keys, [token, ttl_ms, nonce]))

    def extend_call(self, token: str, ttl_ms: int) -> tuple[LuaScript, list[Any], list[Any]]:
        """The script, keys and args of :meth:`extend` (to pipeline it)."""
        return _EXTEND, self._state_keys, [token, ttl_ms, *self._flags]

    def leave(self, token: str) -> int:
        """Take waiter ``token`` out of the queue, waking the one that takes its place.

        Returns the fence of a permit a release granted ``token`` meanwhile, else 0.
        """
        args = [token, "semaphore", *self._flags]
        return int(_LEAVE(self._client, self._leave_keys, args)[1])

    def info(self, name: str, default_limit: int) -> PrimitiveInfo:
        """The semaphore's live leases, waiters and stored limit (else ``default_limit``)."""
        now_ms, rows, waiters, stored = _INFO(self._client, self._info_keys, [])
        leases = [[as_text(v) for v in rows[i : i + 5]] for i in range(0, len(rows), 5)]
        holders = [
            HolderInfo(token[:8], (int(expiry) - int(now_ms)) / 1000.0,
                       int(fence) if fence else None, owner or None)
            for token, expiry, fence, owner, _ in leases
        ]  # fmt: skip
        granted = [int(row[4]) for row in leases if row[4]]
        return PrimitiveInfo(
            kind="semaphore",
            name=name,
            holders=holders,
            waiters=int(waiters),
            since=min(granted) / 1000.0 if granted else None,
            fence=max((h.fence for h in holders if h.fence is not None), default=None),
            limit=int(as_text(stored) or default_limit),
        )
