"""A :class:`~.lock.RedlockLock`'s acquire and release requests, packed once per lock.

An uncontended acquire + release sends one request per master per round, so what the
client does per request counts N times over. Everything but the token, the floor and
the boot marker is the same on every call of a lock (the script, its keys, the TTL):
packed here once, the rest joined on per call; the boot marker, named after a
master's run id, is packed once per run id. The pieces are
:func:`~..resp.evalsha_head`'s head and bulk strings as
:func:`~..resp.pack_evalsha` writes them (``tests/unit/test_redlock_wire.py``
compares them byte for byte).
"""

from __future__ import annotations

from ..lock_scripts import ACQUIRE, RELEASE
from .fanout import PackedFor
from .wire import Call, bulks

__all__ = ["Prepared"]

_BOOT_KEYS = 64
"""Most boot-marker keys kept per lock (one per master's run id; a restart makes a
new one): beyond it the cache starts again."""


class Prepared:
    """The packed pieces of one lock's acquire and release requests."""

    __slots__ = ("_acquire", "_boot", "_boot_prefix", "_boot_suffix", "_done", "_release")

    def __init__(
        self,
        acquire_keys: list[bytes],
        release_keys: list[bytes],
        done: bytes,
        boot_prefix: str,
        max_ttl_ms: int,
    ) -> None:
        # lock_acquire.lua: 5 keys and the boot marker; lock_release.lua: 5 keys and
        # the token's release record (``done`` + token).
        self._acquire = ACQUIRE.head + b"$1\r\n6\r\n" + bulks(acquire_keys)
        self._release = RELEASE.head + b"$1\r\n6\r\n" + bulks(release_keys)
        self._done = done
        self._boot: dict[str, bytes] = {}
        self._boot_prefix, self._boot_suffix = boot_prefix, f":{max_ttl_ms}"

    def acquire(self, token: bytes, args: list[object]) -> tuple[Call, PackedFor]:
        """lock_acquire.lua with ARGV ``[token, *args]``: the reply check, and the
        request to a master of a given run id (its boot marker is the last key)."""
        head = b"*%d\r\n" % (10 + len(args)) + self._acquire
        tail = bulks([token, *args])
        boot = self._boot

        def packed_for(_index: int, run_id: str) -> bytes:
            key = boot.get(run_id)
            if key is None:
                if len(boot) >= _BOOT_KEYS:
                    boot.clear()
                key = boot[run_id] = bulks([f"{self._boot_prefix}{run_id}{self._boot_suffix}"])
            return head + key + tail

        return Call.stamped(ACQUIRE, token), packed_for

    def release(self, token: bytes, record: bytes) -> Call:
        """lock_release.lua of lease ``token``, ``record`` its ARGV[2] ("0": no release
        record unless waiters are queued; "1": always one)."""
        packed = b"*11\r\n" + self._release + bulks([self._done + token, token, record])
        return Call.stamped(RELEASE, token, packed)
