"""The lock's Lua scripts, their keys and arguments, and what their replies mean.

I/O-free: :class:`LockScripts` holds one lock's keys, encoded once, builds each
script's arguments and offers the lock's operations (generators of script calls, see
:mod:`.operations`); the ``*_reply`` functions read each script's reply. The sync
:class:`~.lock.RedisLock` and the async ``AsyncRedisLock`` both run these
operations, so the two differ only in their driver and can never disagree on what a
reply means.
"""

from __future__ import annotations

import secrets
import time
from typing import TypeAlias

from redis.typing import EncodableT, KeyT

from ..errors import RedisRestarting
from .clients import AnyRedisClient
from .info import HolderInfo, PrimitiveInfo
from .keys import KeySpace
from .operations import Call, Operation
from .restart import grace_ms, marking
from .scripts import LuaScript, ScriptReply, as_text, key_encoder, reply_array, reply_int
from .waiting import WAITER_HEARTBEAT_MS, Grant, granted_lease

__all__ = [
    "ACQUIRE",
    "ADOPT",
    "BOOT_MARKER_MS",
    "EXTEND",
    "EXTEND_ADD",
    "FENCE_MEMORY_MS",
    "HELD",
    "INFO",
    "LEAVE",
    "FORCED",
    "NO_RECORD",
    "RELEASE",
    "RELEASE_MEMORY_MS",
    "RELEASE_OWNER",
    "RENEW",
    "ReplyArray",
    "SCRIPT_CONSTANTS",
    "LockScripts",
    "acquire_reply",
    "adopt_reply",
    "info_reply",
    "leave_reply",
    "refusal_holder",
    "refusal_wait_ms",
    "refused_holder",
    "release_reply",
]

FENCE_MEMORY_MS = 3_600_000
"""How long a name's fence counter outlives its last grant (it then restarts from
the server's clock, which is already past every fence it granted)."""

BOOT_MARKER_MS = 86_400_000
"""How long a Redlock master's boot marker is kept (see ``core/redlock``); once it
lapses the next acquire checks the server's uptime again and sets it anew."""

RELEASE_MEMORY_MS = 30_000
"""How long Redis remembers that a release (or an adopt, a release_owner) was done
(``…:done:<token or nonce>``), so a re-send of it after a lost reply answers as the
first execution did: longer than a re-send takes (redis-py re-sends as soon as it
has reconnected); each record costs about 150 bytes of Redis memory for that long."""

SCRIPT_CONSTANTS = {
    "BOOT_MARKER_MS": BOOT_MARKER_MS,
    "FENCE_MEMORY_MS": FENCE_MEMORY_MS,
    "RELEASE_MEMORY_MS": RELEASE_MEMORY_MS,
    "WAITER_HEARTBEAT_MS": WAITER_HEARTBEAT_MS,
}
"""The ``{{NAME}}`` constants of the lock and semaphore scripts (see lib_lock.lua):
written into their text at import rather than sent with every call."""

ACQUIRE = LuaScript("lock_acquire.lua", SCRIPT_CONSTANTS)
RELEASE = LuaScript("lock_release.lua", SCRIPT_CONSTANTS)
EXTEND = LuaScript("lock_extend.lua", SCRIPT_CONSTANTS)
ADOPT = LuaScript("lock_adopt.lua", SCRIPT_CONSTANTS)
LEAVE = LuaScript("queue_leave.lua", SCRIPT_CONSTANTS)
INFO = LuaScript("lock_info.lua", SCRIPT_CONSTANTS)
RELEASE_OWNER = LuaScript("lock_release_owner.lua", SCRIPT_CONSTANTS)
RENEW = LuaScript("lock_renew.lua", SCRIPT_CONSTANTS)
HELD = LuaScript("lock_held.lua", SCRIPT_CONSTANTS)
EXTEND_ADD = LuaScript("lock_extend_add.lua", SCRIPT_CONSTANTS)

_WAIT = b"1"  # constant script argument, encoded once
NO_RECORD = b"0"
"""``lock_release.lua``'s ARGV[2] for a caller that judges a re-sent release itself
(see :func:`release_reply`): no release record unless waiters are queued."""
FORCED = b"f"
"""``lock_release.lua``'s ARGV[2] for an operator's release of someone else's lease
(``release_all``): no release record at all, so the holder's own release later finds
the lease gone and reports it lost (#30)."""
_LOCK_RULE = "lock"

ReplyArray: TypeAlias = list[ScriptReply]
"""A script's array reply (see :data:`~.scripts.ScriptReply`)."""


class LockScripts:
    """One lock's script keys, encoded once with the client's own encoder (what
    redis-py would send for the str), and its argument lists; no I/O.

    The scripts derive the wake-up channel from the holders key (``channel``).
    """

    __slots__ = ("_base", "_client", "_encode", "_keys", "acquire_keys", "grace", "release_keys")

    def __init__(
        self, client: AnyRedisClient, keys: KeySpace, restart_grace: object = None, ttl_ms: int = 0
    ) -> None:
        encode = self._encode = key_encoder(client)
        self._keys, self._client = keys, client
        # The restart grace (restart.py) sent with each acquire, if any.
        ms = grace_ms(restart_grace, ttl_ms, client)
        self.grace: bytes | None = b"%d" % ms if ms else None
        # The common part encoded once, the parts appended as bytes: a lock is cheap
        # to build per call (what redis-py would send for each key's str). Only the
        # uncontended path's lists are made here; the others when asked for.
        base = self._base = encode(keys.base)
        holders, fence, queue = base + b":holders", base + b":fence", base + b":queue"
        alive, asks = base + b":alive", base + b":asks"
        self.acquire_keys: list[KeyT] = [holders, fence, queue, alive, asks]
        self.release_keys: list[KeyT] = [holders, queue, alive, asks, fence]

    @property
    def queue_keys(self) -> list[KeyT]:
        """KEYS of the queue scripts: holders, queue, alive, asks."""
        return self.release_keys[:4]

    @property
    def adopt_keys(self) -> list[KeyT]:
        """KEYS of ``lock_adopt.lua`` (before its record key): holders, fence."""
        return [self.acquire_keys[0], self.acquire_keys[1]]

    @property
    def holders_key(self) -> list[KeyT]:
        """KEYS of the one-key scripts: holders."""
        return [self.acquire_keys[0]]

    @property
    def info_keys(self) -> list[KeyT]:
        """KEYS of ``lock_info.lua``: holders, queue, alive (live waiters counted)."""
        return [self.acquire_keys[0], self.acquire_keys[2], self.acquire_keys[3]]

    @property
    def add_keys(self) -> list[KeyT]:
        """KEYS of ``lock_extend_add.lua``: holders, added."""
        return [self.acquire_keys[0], self._base + b":added"]

    @property
    def channel(self) -> str:
        """The wake-up channel (the scripts derive it from the holders key)."""
        return self._keys.channel

    def acquire_args(
        self, token: str, ttl_ms: int, owner: str | None, wait: bool = False
    ) -> list[EncodableT]:
        """``lock_acquire.lua``'s ARGV: one that joins (or stays in) the wait queue
        when refused if ``wait``; the script's trailing defaults (no owner, no wait)
        left out of an attempt that does not (each argument costs client CPU)."""
        if self.grace is not None:  # a restart grace (see .restart)
            return [token, ttl_ms, owner or "", _WAIT if wait else b"0", b"", self.grace]
        if wait:
            return [token, ttl_ms, owner or "", _WAIT]
        return [token, ttl_ms, owner] if owner else [token, ttl_ms]

    def marking(self) -> Operation[None]:
        """The server's boot marker set first when acquires send a restart grace
        (once per client and prefix, see :func:`.restart.mark`)."""
        if self.grace is not None:
            yield from marking(self._client, self._keys.prefix)

    def attempt(
        self, token: str, ttl_ms: int, owner: str | None, wait: bool = False
    ) -> Operation[tuple[ScriptReply, float]]:
        """One acquire attempt (see :meth:`acquire_args`): its reply (read it with
        :func:`acquire_reply`) and when it was sent."""
        if self.grace is not None:
            yield from self.marking()
        args = self.acquire_args(token, ttl_ms, owner, wait)
        sent_at = time.monotonic()
        return (yield Call(ACQUIRE, self.acquire_keys, args)), sent_at

    def queued_attempt(
        self, token: str, ttl_ms: int, owner: str | None, refusal: ReplyArray
    ) -> Operation[Grant | int]:
        """A waiter's attempt (it joins, or stays in, the queue when refused): the
        grant, else the ms the holder has left (0: unknown); ``refusal`` keeps the
        refusal (its holder's owner id, see :func:`refused_holder`)."""
        answer, sent_at = yield from self.attempt(token, ttl_ms, owner, wait=True)
        grant = acquire_reply(answer, sent_at, ttl_ms)
        if grant is not None:
            return grant
        refusal[:] = reply_array(answer)
        return refusal_wait_ms(answer)

    @staticmethod
    def extend_args(token: str, ttl_ms: int, gen: int = 0) -> list[EncodableT]:
        """``lock_extend.lua``'s ARGV (``gen``: an explicit change's generation, left out
        when 0)."""
        return [token, ttl_ms, gen] if gen else [token, ttl_ms]

    @staticmethod
    def add_args(token: str, ttl_ms: int, nonce: str, gen: int = 0) -> list[EncodableT]:
        """``lock_extend_add.lua``'s (and ``semaphore_extend_add.lua``'s) ARGV."""
        return [token, ttl_ms, nonce, gen] if gen else [token, ttl_ms, nonce]

    @staticmethod
    def leave_args(token: str) -> list[EncodableT]:
        """Waiter ``token`` gives up (``queue_leave.lua`` with the lock's rule)."""
        return [token, _LOCK_RULE]

    def adopt_call(
        self, token: str, new_token: str, ttl_ms: int, owner: str | None
    ) -> tuple[list[KeyT], list[EncodableT]]:
        """KEYS and ARGV handing lease ``token`` over to ``new_token``, with a fresh
        nonce: a re-send of this call is told the lease it made, another call is not."""
        nonce = secrets.token_hex(16)
        keys = [*self.adopt_keys, self._encode(self._keys.done(nonce))]
        return keys, [token, new_token, ttl_ms, owner or "", nonce]

    def release_call(self, token: str) -> list[KeyT]:
        """KEYS releasing ``token`` (ARGV: ``[token]``), with its record for re-sends."""
        return [*self.release_keys, self._base + b":done:" + self._encode(token)]

    def release_owner_call(self, owner: str) -> tuple[list[KeyT], list[EncodableT]]:
        """KEYS and ARGV releasing the leases of ``owner`` ("": every lease), with a
        fresh nonce: a re-send of this call gets the same count."""
        nonce = secrets.token_hex(16)
        return [*self.queue_keys, self._encode(self._keys.done(nonce))], [nonce, owner]

    @staticmethod
    def info_args() -> list[EncodableT]:
        """ARGV of ``lock_info.lua``: a nonce that stamps its reply."""
        return [secrets.token_hex(8)]

    # -- operations (see .operations) -------------------------------------------------

    def release(self, token: str, deadline: float | None = None) -> Operation[bool]:
        """Give up lease ``token``: True when it was live and is now released.

        ``deadline``: the lease's local deadline, for a driver that sees its own
        re-sends (:func:`~.scripts.sees_resends`): the common release then writes no
        record, and a lease found gone after a re-send is judged by the deadline (see
        :func:`release_reply`). None: the release is recorded for a re-send."""
        if deadline is None:
            return bool((yield Call(RELEASE, self.release_call(token), [token])))
        sends: list[None] = []
        answer = yield Call(RELEASE, self.release_call(token), [token, NO_RECORD], sends=sends)
        return release_reply(answer, sends, deadline)

    def revoke(self, token: str) -> Operation[bool]:
        """An operator's release of lease ``token`` (not its holder's): True when it
        was live. Leaves no record, so the holder's own release answers False."""
        return bool((yield Call(RELEASE, self.release_call(token), [token, FORCED])))

    def extend(self, token: str, ttl_ms: int, gen: int = 0) -> Operation[bool]:
        """Set lease ``token`` to expire ``ttl_ms`` from now; False when not live."""
        return bool((yield Call(EXTEND, self.holders_key, self.extend_args(token, ttl_ms, gen))))

    def extend_add(
        self, token: str, ttl_ms: int, nonce: str, gen: int = 0, cap_ms: int = 0
    ) -> Operation[int]:
        """Add ``ttl_ms`` to what lease ``token`` has left, up to ``cap_ms`` left (0:
        no cap); the ms left after (0: not live)."""
        args = self.add_args(token, ttl_ms, nonce, gen)
        if cap_ms:
            args = [token, ttl_ms, nonce, gen, cap_ms]
        return reply_int((yield Call(EXTEND_ADD, self.add_keys, args)))

    def held(self, token: str) -> Operation[int]:
        """The ms lease ``token`` has left on the server, 0 when not live."""
        return reply_int((yield Call(HELD, self.holders_key, [token])))

    def leave(self, token: str) -> Operation[int]:
        """Take waiter ``token`` out of the queue; the fence of a lease granted to it
        meanwhile, else 0."""
        return leave_reply((yield Call(LEAVE, self.queue_keys, self.leave_args(token))))

    def release_owner(self, owner: str) -> Operation[int]:
        """Release every lease if the owner id is ``owner`` ("": whoever holds it)."""
        keys, args = self.release_owner_call(owner)
        return reply_int((yield Call(RELEASE_OWNER, keys, args)))

    def info(self, name: str) -> Operation[PrimitiveInfo]:
        """The lock's holders, owner, fence and waiters (read-only)."""
        return info_reply(name, (yield Call(INFO, self.info_keys, self.info_args())))

    def adopt(
        self, token: str, new_token: str, ttl_ms: int, owner: str | None
    ) -> Operation[Grant | None]:
        """Replace live lease ``token`` by ``new_token`` (see ``RedisLock.adopt``); the
        new lease's grant, None when ``token`` is not live."""
        keys, args = self.adopt_call(token, new_token, ttl_ms, owner)
        sent_at = time.monotonic()
        return adopt_reply((yield Call(ADOPT, keys, args)), sent_at, ttl_ms)


def acquire_reply(answer: ScriptReply, sent_at: float, ttl_ms: int) -> Grant | None:
    """The grant in a ``lock_acquire.lua`` reply to an attempt sent at ``sent_at``, or
    None when it was refused (``{0, wait_ms, holder}``: see :func:`refusal_wait_ms`)."""
    if isinstance(answer, int):
        return answer, sent_at  # a new lease: its fence, its full TTL left
    answer = reply_array(answer)
    if answer[0] == 1:  # a lease this token holds already (a re-sent request, a grant)
        return granted_lease(reply_int(answer[1]), sent_at, reply_int(answer[2]), ttl_ms)
    return None


def release_reply(answer: ScriptReply, sends: list[None], deadline: float) -> bool:
    """Whether a ``lock_release.lua`` call sent with :data:`NO_RECORD` released the lease
    of local ``deadline``: it answered 1, or it found the lease gone after being sent
    again (``sends``, see :class:`.LuaScript`) and the answer came before ``deadline``.
    Before it the lease cannot have expired on the server (the deadline counts from
    before the request that set it), so the lease was gone because the first send,
    whose reply was lost, released it -- unless it had been taken away before (a
    forced release: ``force_release``, ``release_owner``, ``release_all``; an adopt; a
    failover to a replica that never had it), which this cannot tell apart (a release
    record would; it is written only when waiters are queued)."""
    if answer:
        return True
    return len(sends) > 1 and time.monotonic() < deadline


def refusal_wait_ms(answer: ScriptReply) -> int:
    """The holder's TTL left (ms, 0 when unknown) in a refusal of ``lock_acquire.lua``."""
    return reply_int(reply_array(answer)[1])


def refused_holder(answer: ReplyArray) -> str | None:
    """:func:`refusal_holder`, but :class:`RedisRestarting` for a free lock refused
    within a restart grace (see ``core/restart.py``)."""
    if len(answer) > 3:
        raise RedisRestarting(
            "the lock Redis lost its data and is in its restart grace for "
            f"{reply_int(answer[1]) / 1000:g} s more: a lease it forgot may still be live"
        )
    return refusal_holder(answer)


def refusal_holder(answer: ScriptReply) -> str | None:
    """The holding owner id in a refusal of ``lock_acquire.lua`` (None: none given,
    or the lock is free but promised to an earlier waiter)."""
    return as_text(reply_array(answer)[2]) or None


def leave_reply(answer: ScriptReply) -> int:
    """The fence of a lease granted to the leaving waiter meanwhile (``queue_leave.lua``),
    else 0."""
    return reply_int(reply_array(answer)[1])


def adopt_reply(answer: ScriptReply, sent_at: float, ttl_ms: int) -> Grant | None:
    """The new lease in a ``lock_adopt.lua`` reply to a call sent at ``sent_at`` (its
    fence and when it counts from), None when not adopted."""
    answer = reply_array(answer)
    if answer[0] != 1:
        return None
    return granted_lease(reply_int(answer[1]), sent_at, reply_int(answer[2]), ttl_ms)


def info_reply(name: str, answer: ScriptReply) -> PrimitiveInfo:
    """The :class:`PrimitiveInfo` of a ``lock_info.lua`` reply."""
    now, listed, waiters = reply_array(answer)
    now_ms, flat = reply_int(now), reply_array(listed)
    fields = {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}
    holders = [
        HolderInfo(
            token_hint=field[2:10],
            ttl_left=(int(value) - now_ms) / 1000.0,
            fence=int(fields.get("f:" + field[2:], "0")),
            owner=fields.get("owner") or None,
        )
        for field, value in fields.items()
        if field.startswith("t:") and int(value) > now_ms
    ]
    return PrimitiveInfo(
        kind="lock",
        name=name,
        holders=holders,
        waiters=reply_int(waiters),
        owner=(fields.get("owner") or None) if holders else None,
        since=int(fields["since"]) / 1000.0 if holders and "since" in fields else None,
        fence=int(fields["fence"]) if holders and "fence" in fields else None,
    )
