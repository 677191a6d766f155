"""The semaphore's Lua scripts (``lua/semaphore_*.lua``), their keys and arguments,
and what their replies mean; no I/O.

:class:`SemaphoreScripts` builds each script's KEYS and constant ARGV once for one
semaphore and offers its operations (generators of script calls, see
:mod:`.operations`); the ``*_reply`` functions read the replies. The sync
:class:`~.semaphore.RedisSemaphore` and the async ``AsyncRedisSemaphore`` both run
these operations and differ only in their driver. Wake-ups go to the waiter's own
process: a token ends in ``.<tag>``, the tag of the process that made it, and the
scripts publish it on ``<wake channel>:<tag>``, which only that process listens to
(the scripts derive the channel from the holders key: :attr:`.KeySpace.channel`).
A release grants the permits it frees to the first waiters itself and tells them
``<token> <fence>`` (see ``hand_over_permits`` in lib_semaphore.lua).
"""

from __future__ import annotations

import logging
import secrets
import time

from redis.typing import EncodableT, KeyT

from .clients import AnyRedisClient
from .info import HolderInfo, PrimitiveInfo
from .keys import KeySpace
from .lock_scripts import FORCED, LEAVE, SCRIPT_CONSTANTS, LockScripts, leave_reply
from .operations import Call, Operation
from .restart import marking
from .scripts import LuaScript, ScriptReply, as_text, key_encoder, reply_array, reply_int
from .waiting import Grant, granted_lease

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "EXTEND_ADD",
    "HELD",
    "INFO",
    "LEAVE",
    "PATIENCE_MS",
    "RELEASE",
    "RELEASE_OWNER",
    "RENEW",
    "SemaphoreScripts",
    "acquire_reply",
    "attempt_outcome",
    "info_reply",
    "release_reply",
]

log = logging.getLogger("celery_redislock.core.semaphore")

PATIENCE_MS = 2.0
"""Not fair: once the longest waiter has waited this long (ms), newcomers no longer
barge in ahead of the queue, which bounds every wait."""

ACQUIRE = LuaScript("semaphore_acquire.lua", SCRIPT_CONSTANTS)
RELEASE = LuaScript("semaphore_release.lua", SCRIPT_CONSTANTS)
EXTEND = LuaScript("semaphore_extend.lua", SCRIPT_CONSTANTS)
RELEASE_OWNER = LuaScript("semaphore_release_owner.lua", SCRIPT_CONSTANTS)
INFO = LuaScript("semaphore_info.lua", SCRIPT_CONSTANTS)
HELD = LuaScript("semaphore_held.lua", SCRIPT_CONSTANTS)
EXTEND_ADD = LuaScript("semaphore_extend_add.lua", SCRIPT_CONSTANTS)
RENEW = LuaScript("semaphore_renew.lua", SCRIPT_CONSTANTS)
"""The renewer's batch script for semaphore leases (keys: holders, leases)."""


class SemaphoreScripts:
    """The script keys and arguments of one semaphore: its keys encoded once (as
    redis-py would encode them), its limit and fairness baked in; ``channel`` is its
    wake-up channel (the scripts derive it from the holders key)."""

    __slots__ = (
        "_acquire_args",
        "_client",
        "_encode",
        "_flags",
        "_keys",
        "acquire_keys",
        "add_keys",
        "channel",
        "grace",
        "info_keys",
        "leave_keys",
        "release_keys",
        "state_keys",
        "warned_limit",
    )

    def __init__(
        self, client: AnyRedisClient, keys: KeySpace, limit: int, fair: bool, grace_ms: int = 0
    ) -> None:
        self.channel = keys.channel
        self._client = client
        encode = self._encode = key_encoder(client)
        self._keys = keys
        base = encode(keys.base)  # the parts appended as bytes (see LockScripts)
        holders, leases, fence, queue, alive, meta, asks = (
            base + part
            for part in (
                b":holders",
                b":leases",
                b":fence",
                b":queue",
                b":alive",
                b":meta",
                b":asks",
            )
        )
        self._flags = [b"%d" % limit, b"1" if fair else b"0"]  # limit, fair
        self.acquire_keys: list[KeyT] = [holders, leases, fence, queue, alive, meta, asks]
        self._acquire_args = [*self._flags, b"%d" % round(PATIENCE_MS * 1000)]
        self.release_keys: list[KeyT] = [holders, leases, queue, alive, meta, asks, fence]
        self.state_keys: list[KeyT] = [holders, leases, queue, alive, meta, asks]
        self.leave_keys: list[KeyT] = [holders, queue, alive, asks, leases]
        self.info_keys: list[KeyT] = [holders, leases, queue, meta, alive]
        self.add_keys: list[KeyT] = [holders, leases, base + b":added"]
        # The restart grace (ms) sent, if any (see restart.py).
        self.grace: bytes | None = b"%d" % grace_ms if grace_ms else None
        self.warned_limit = False  # an acquire replaced the stored limit: logged once

    def acquire_args(self, token: str, owner: str, ttl_ms: int, wait: bool) -> list[EncodableT]:
        """``semaphore_acquire.lua``'s ARGV (owner left out when none: its default)."""
        args: list[EncodableT] = [token, ttl_ms, *self._acquire_args, b"1" if wait else b"0"]
        if self.grace is not None:
            args += [owner, self.grace]
        elif owner:
            args.append(owner)
        return args

    def release_args(self, token: str, here: str | None = None) -> list[EncodableT]:
        """``semaphore_release.lua``'s ARGV (``here``: the caller's own waiter tag,
        whose waiters granted by this release the reply names; read it with
        :func:`release_reply`)."""
        if self.grace is not None:
            return [token, *self._flags, here or "", self.grace]
        return [token, *self._flags, here] if here else [token, *self._flags]

    def release_call(self, token: str) -> list[KeyT]:
        """``semaphore_release.lua``'s KEYS for ``token``, with its record for re-sends."""
        return [*self.release_keys, self._encode(self._keys.done(token))]

    def release_owner_call(self, owner: str) -> tuple[list[KeyT], list[EncodableT]]:
        """``semaphore_release_owner.lua``'s KEYS and ARGV ("": every permit), with a
        fresh nonce: a re-send of this call gets the same count."""
        nonce = secrets.token_hex(16)
        keys = [*self.state_keys, self._encode(self._keys.done(nonce))]
        return keys, [nonce, owner, *self._flags]

    @staticmethod
    def info_args() -> list[EncodableT]:
        """``semaphore_info.lua``'s ARGV: a nonce that stamps its reply."""
        return [secrets.token_hex(8)]

    def extend_args(self, token: str, ttl_ms: int, gen: int = 0) -> list[EncodableT]:
        """``semaphore_extend.lua``'s ARGV (``gen``: an explicit change's generation,
        left out when 0)."""
        return [token, ttl_ms, *self._flags, gen] if gen else [token, ttl_ms, *self._flags]

    def extend_call(
        self, token: str, ttl_ms: int
    ) -> tuple[LuaScript, list[KeyT], list[EncodableT]]:
        """The script, keys and args of an extend (to pipeline it, see :mod:`.replicas`)."""
        return EXTEND, self.state_keys, self.extend_args(token, ttl_ms)

    def leave_args(self, token: str) -> list[EncodableT]:
        """``queue_leave.lua``'s ARGV with the semaphore's rule (read its reply with
        :func:`.lock_scripts.leave_reply`)."""
        return [token, "semaphore", *self._flags]

    # -- operations (see .operations; the same names and meaning as LockScripts') ----

    def attempt(
        self, token: str, owner: str, ttl_ms: int, wait: bool
    ) -> Operation[tuple[tuple[int, int, int, int], float]]:
        """One acquire attempt (queued when refused if ``wait``): its
        :func:`acquire_reply` and when it was sent."""
        if self.grace is not None:
            yield from self.marking()
        args = self.acquire_args(token, owner, ttl_ms, wait)
        sent_at = time.monotonic()
        reply = self.limit_checked(acquire_reply((yield Call(ACQUIRE, self.acquire_keys, args))))
        return reply, sent_at

    def marking(self) -> Operation[None]:
        """The server's boot marker set first when acquires send a restart grace
        (once per client and prefix, see :func:`.restart.mark`)."""
        if self.grace is not None:
            yield from marking(self._client, self._keys.prefix)

    def limit_checked(self, reply: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """An :func:`acquire_reply`, logged (once per semaphore object) when the
        acquire replaced the stored limit."""
        if reply[2] and not self.warned_limit:
            self.warned_limit = True
            log.warning(
                "celery_redislock: semaphore %r was limited to %s; now enforcing limit=%s",
                self._keys.name,
                reply[2],
                self._flags[0].decode(),
            )
        return reply

    def release(self, token: str, deadline: float | None = None) -> Operation[bool]:
        """Give up lease ``token``: True when it was live and is now released (also to
        a re-send of that release; ``deadline`` is not needed: always recorded)."""
        del deadline
        return bool((yield Call(RELEASE, self.release_call(token), self.release_args(token))))

    def release_granting(
        self, token: str, here: str
    ) -> Operation[tuple[bool, list[tuple[str, int]]]]:
        """:meth:`release`, also naming the waiters of tag ``here`` it granted a permit
        (see :func:`release_reply`)."""
        reply = yield Call(RELEASE, self.release_call(token), self.release_args(token, here))
        return release_reply(reply)

    def revoke(self, token: str) -> Operation[bool]:
        """An operator's release of lease ``token`` (not its holder's): True when it
        was live. Leaves no record, so the holder's own release answers False."""
        args: list[EncodableT] = [token, *self._flags, "", self.grace or "", FORCED]
        return bool((yield Call(RELEASE, self.release_call(token), args)))

    def extend(self, token: str, ttl_ms: int, gen: int = 0) -> Operation[bool]:
        """Set lease ``token`` to expire ``ttl_ms`` from now; False when not live."""
        return bool((yield Call(EXTEND, self.state_keys, self.extend_args(token, ttl_ms, gen))))

    def extend_add(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> Operation[int]:
        """Add ``ttl_ms`` to what lease ``token`` has left; the ms left after (0: not live)."""
        args = LockScripts.add_args(token, ttl_ms, nonce, gen)
        return reply_int((yield Call(EXTEND_ADD, self.add_keys, args)))

    def held(self, token: str) -> Operation[int]:
        """The ms lease ``token`` has left on the server, 0 when not live."""
        return reply_int((yield Call(HELD, self.add_keys[:1], [token])))

    def leave(self, token: str) -> Operation[int]:
        """Take waiter ``token`` out of the queue, waking the one that takes its place;
        the fence of a permit a release granted ``token`` meanwhile, else 0."""
        return leave_reply((yield Call(LEAVE, self.leave_keys, self.leave_args(token))))

    def release_owner(self, owner: str) -> Operation[int]:
        """Release every lease whose owner id is ``owner`` ("": every lease)."""
        keys, args = self.release_owner_call(owner)
        return reply_int((yield Call(RELEASE_OWNER, keys, args)))

    def info(self, name: str, limit: int) -> Operation[PrimitiveInfo]:
        """Live leases, waiters and the stored limit (``limit`` when none), read-only."""
        return info_reply(name, limit, (yield Call(INFO, self.info_keys, self.info_args())))


def acquire_reply(answer: ScriptReply) -> tuple[int, int, int, int]:
    """A ``semaphore_acquire.lua`` reply: ``(1, fence, previous, ms_left)`` granted,
    ``(0, wait_ms, previous, 0)`` refused.

    ``previous`` is the limit stored before, when the call changed it, else 0;
    ``ms_left`` the TTL the lease has left (less than asked when a release had
    granted it to this waiter already).
    """
    reply = reply_array(answer)
    granted, value, previous = reply_int(reply[0]), reply_int(reply[1]), reply_int(reply[2])
    return granted, value, previous, reply_int(reply[3]) if reply[0] else 0


def release_reply(reply: ScriptReply) -> tuple[bool, list[tuple[str, int]]]:
    """A ``semaphore_release.lua`` reply: whether the lease was released, and the
    ``(token, fence)`` of each waiter of the caller's tag it granted a permit (none
    unless the call passed ``here``, see :meth:`SemaphoreScripts.release_args`)."""
    if not isinstance(reply, list):
        return bool(reply), []
    words = as_text(reply[1]).split()
    return bool(reply[0]), [(words[i], int(words[i + 1])) for i in range(0, len(words), 2)]


def attempt_outcome(reply: tuple[int, int, int, int], sent_at: float, ttl_ms: int) -> Grant | int:
    """What an attempt sent at ``sent_at`` got, from its :func:`acquire_reply`: the
    :data:`~.waiting.Grant`, or when refused the ms to wait (0: unknown)."""
    granted, value, _previous, left = reply
    return granted_lease(value, sent_at, left, ttl_ms) if granted else value


def info_reply(name: str, default_limit: int, reply: ScriptReply) -> PrimitiveInfo:
    """The :class:`PrimitiveInfo` of a ``semaphore_info.lua`` reply (the stored limit,
    else ``default_limit``)."""
    now_ms, listed, waiters, stored = reply_array(reply)
    rows = reply_array(listed)
    leases = [[as_text(v) for v in rows[i : i + 5]] for i in range(0, len(rows), 5)]
    holders = [
        HolderInfo(
            token[:8],
            (int(expiry) - reply_int(now_ms)) / 1000.0,
            int(fence) if fence else None,
            owner or None,
        )
        for token, expiry, fence, owner, _ in leases
    ]
    granted = [int(row[4]) for row in leases if row[4]]
    return PrimitiveInfo(
        kind="semaphore",
        name=name,
        holders=holders,
        waiters=reply_int(waiters),
        since=min(granted) / 1000.0 if granted else None,
        fence=max((h.fence for h in holders if h.fence is not None), default=None),
        limit=int(as_text(stored) or default_limit),
    )
