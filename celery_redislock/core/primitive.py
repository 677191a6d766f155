"""What ``RedisLock`` and ``RedisSemaphore`` share: checked settings, the ``with``
statement, lease terms and creation, and the process-tagged tokens their waiters use.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import ClassVar

from redis.exceptions import RedisError
from redis.typing import EncodableT, KeyT

from ..errors import ConfigurationError, LockTimeout
from .clients import AnyRedisClient
from .keys import KeySpace
from .lease import Lease, OnLost, current_pid
from .lease_state import Undecided
from .operations import PrimitiveOperations, run
from .pubsub import pubsub_mode
from .replicas import DEFAULT_REPLICA_TIMEOUT, check_replica_ack, remaining_ms
from .scripts import LuaScript, RedisClient
from .validate import capped_ttl_ms, check_bool, check_client, check_max_hold, ttl_to_ms

__all__ = ["Primitive", "PrimitiveBase", "ServerPrimitive", "check_owner", "fresh_token"]


def check_owner(owner: object) -> str:
    """``owner`` if it is a non-empty string (``release_owner``'s argument)."""
    if not isinstance(owner, str) or not owner:
        raise ConfigurationError(f"owner must be a non-empty string, got {owner!r}")
    return owner


class PrimitiveBase:
    """What the sync and async locks and semaphores share, with no I/O: checked
    settings, keys and lease terms. Subclasses set :attr:`kind` (the key-space kind)."""

    kind: ClassVar[str]
    _client: AnyRedisClient

    def __init__(
        self,
        client: AnyRedisClient,
        name: str,
        *,
        ttl: float,
        prefix: str,
        renew: bool,
        max_hold: float | None,
    ) -> None:
        self._client = self._checked_client(client)
        self._keys = KeySpace.build(prefix, self.kind, name)
        self._ttl_ms = ttl_to_ms(ttl)
        self.renew = check_bool(renew, "renew")
        self.max_hold = check_max_hold(max_hold)

    @staticmethod
    def _checked_client(client: object) -> AnyRedisClient:
        """``client`` if it is a client of the kind the subclass talks through."""
        return check_client(client)

    @property
    def name(self) -> str:
        """The name given at construction."""
        return self._keys.name

    @property
    def client(self) -> AnyRedisClient:
        """The Redis client this talks to."""
        return self._client

    @property
    def keys(self) -> KeySpace:
        """The Redis keys and wake-up channel."""
        return self._keys

    @property
    def ttl(self) -> float:
        """Default lease time in seconds."""
        return self._ttl_ms / 1000.0

    def _not_granted(
        self, blocking: bool, timeout: float | None, holder: str | None
    ) -> LockTimeout:
        """What ``hold()`` raises when its acquire was not granted."""
        waited = timeout if blocking and timeout else None
        by = f" (held by owner {holder!r})" if holder else ""
        how = f"within {timeout:g} s" if waited is not None else "without waiting"
        return LockTimeout(
            f"{self.kind} {self.name!r} was not granted {how}{by}", self.name, waited, holder
        )

    def _lease_terms(
        self, ttl: float | None, max_hold: float | None, owner: str | None
    ) -> tuple[int, float | None]:
        """Check one acquire's arguments; its TTL in ms (capped) and its ``max_hold``."""
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigurationError(f"owner must be a non-empty string or None, got {owner!r}")
        max_hold = self.max_hold if max_hold is None else check_max_hold(max_hold)
        return capped_ttl_ms(self._ttl_ms if ttl is None else ttl_to_ms(ttl), max_hold), max_hold


class Primitive(PrimitiveBase):
    """Base of the sync lock and semaphore: a named thing that grants :class:`Lease`\\ s.

    Subclasses implement ``acquire``.
    """

    _client: RedisClient

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float,
        prefix: str,
        renew: bool,
        max_hold: float | None,
        min_replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
        wait_aof: bool = False,
    ) -> None:
        super().__init__(client, name, ttl=ttl, prefix=prefix, renew=renew, max_hold=max_hold)
        defaults = (
            min_replicas.__class__ is int
            and min_replicas == 0
            and wait_aof is False
            and replica_timeout is DEFAULT_REPLICA_TIMEOUT
        )
        # The defaults need no check: a lock is cheap to build per call.
        self._ack = (
            None
            if defaults
            else check_replica_ack(self._client, min_replicas, replica_timeout, wait_aof)
        )
        # `with lock:` leases by thread (a dict: a threading.local costs more than the
        # rest of a lock built per call). Made here, not by the first `with`: an empty
        # dict costs less than the lock that two first `with`s at once would need.
        self._stacks: dict[int, list[Lease]] = {}

    @property
    def client(self) -> RedisClient:
        """The Redis client this talks to."""
        return self._client

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> Lease | None:
        """Take a lease (see the subclass)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def hold(
        self,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
        ttl: float | None = None,
        renew: bool | None = None,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
    ) -> Iterator[Lease]:
        """``with lock.hold(timeout=5) as lease:`` -- acquire with options, release on exit.

        Takes the arguments of ``acquire`` (keyword-only; the wait starts when the
        ``with`` block is entered). Raises :class:`~celery_redislock.errors.LockTimeout`
        when not granted within ``timeout`` seconds, or at once with
        ``blocking=False`` (or ``timeout=0``) when held elsewhere: the block never
        runs without the lease. Leaving the block releases the lease; if it was lost
        meanwhile, :class:`~celery_redislock.errors.LockNotOwned` is raised (chained to
        any exception from the block), as for ``with lock as lease:``.
        """
        check_bool(blocking, "blocking")
        lease, holder = self._hold_attempt(blocking, timeout, owner, ttl, renew, on_lost, max_hold)
        if lease is None:
            raise self._not_granted(blocking, timeout, holder)
        with lease:
            yield lease

    def __enter__(self) -> Lease:
        lease = self.acquire()
        assert lease is not None  # a blocking acquire without timeout returns a lease
        ident = threading.get_ident()
        stack = self._stacks.get(ident)
        if stack is None:
            self._stacks[ident] = [lease]  # only this thread writes its own entry
        else:
            stack.append(lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ident = threading.get_ident()
        stack = self._stacks[ident]
        lease = stack.pop()
        if not stack:
            del self._stacks[ident]  # a thread id may be reused by another thread
        lease.__exit__(exc_type, exc, tb)

    # -- for the subclasses -----------------------------------------------------------

    def _hold_attempt(
        self,
        blocking: bool,
        timeout: float | None,
        owner: str | None,
        ttl: float | None,
        renew: bool | None,
        on_lost: OnLost | None,
        max_hold: float | None,
    ) -> tuple[Lease | None, str | None]:
        """``hold``'s acquire: the lease (or None) and the holder's owner id if known."""
        lease = self.acquire(
            blocking, timeout, owner, ttl=ttl, renew=renew, on_lost=on_lost, max_hold=max_hold
        )
        return lease, None

    def release_owner(self, owner: str) -> int:
        """Release every lease whose owner id is ``owner``; the number released (a
        Redlock: the number of masters where it was released).

        For code that knows the owner but holds no lease (an operator, a process that
        cleans up after a dead one, e.g. a Celery worker's main process after a child
        was killed). Owner-checked on the server in one round trip; the waiters that
        may now proceed are woken.
        """
        return self._release_owner(check_owner(owner))

    def force_release(self) -> int:
        """Release every lease, whoever holds it; the number released (a Redlock: the
        number of masters where it was released).

        The holders' leases report themselves lost at their next renewal, release or
        extend. Meant for operators clearing stuck leases, never for normal flow.
        """
        return self._release_owner("")

    def _release_owner(self, owner: str) -> int:
        """Release the leases of ``owner`` ("": every lease); how many (the subclass
        runs ``release_owner`` of its operations)."""
        raise NotImplementedError

    def _held_token(self, token: str) -> int:
        """The ms ``token``'s lease has left on the server, 0 when not live (read-only,
        one round trip; the lease's side, see :meth:`.Lease.held`)."""
        raise NotImplementedError

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int | Undecided:
        """Add ``ttl_ms`` to what ``token``'s lease has left, in one round trip; the ms
        it has left afterwards, 0 when not live (see :meth:`.Lease.extend`;
        :class:`~.lease_state.Undecided` from a Redlock that could not tell yet)."""
        raise NotImplementedError

    def _release_token(self, token: str) -> bool:
        """Give up ``token`` in one round trip (the lease's side; see the subclass)."""
        raise NotImplementedError

    def _release_lease(self, token: str, deadline: float) -> bool:
        """A lease's release (``deadline``: its local one, for a holder that judges a
        re-sent release by it); by the token alone unless the subclass says."""
        return self._release_token(token)

    def _extend_token(self, token: str, ttl_ms: int) -> bool | Undecided:
        """Set ``token``'s TTL in one round trip (the lease's side; see the subclass;
        :class:`~.lease_state.Undecided` from a Redlock that could not tell yet)."""
        raise NotImplementedError

    def _extend_call(
        self, token: str, ttl_ms: int
    ) -> tuple[LuaScript, list[KeyT], list[EncodableT]]:
        """The script, keys and args of :meth:`_extend_token` (replica confirmation)."""
        raise NotImplementedError

    def _prepare_renewal(self, renew: bool | None) -> None:
        """Before an acquire that will be renewed is sent: the renewer opens its own
        connection meanwhile (see ``renewal.sender``), ready for the first renewal."""
        if self.renew if renew is None else renew:
            from .renewal import prepare

            prepare(self._client)

    def _new_lease(
        self,
        token: str,
        fence: int,
        ttl_ms: int,
        owner: str | None,
        sent_at: float,
        renew: bool | None,
        on_lost: OnLost | None,
        max_hold: float | None,
        acked: object = None,
    ) -> Lease:
        """The lease for a grant, handed to the renewer when renewal is on.

        With ``min_replicas`` / ``wait_aof`` the grant first waits for its replicas
        (see :mod:`.replicas`); unacknowledged, it is released and the error raised.
        ``acked``: the answer of a wait already sent right after the grant's own write.
        """
        if self._ack is not None:
            try:
                if acked is not None:
                    self._ack.check(self.name, acked)
                else:
                    script, keys, args = self._extend_call(token, remaining_ms(ttl_ms, sent_at))
                    self._ack.confirm(self._client, self.name, script, keys, args)
            except BaseException:
                with contextlib.suppress(RedisError):
                    self._release_token(token)  # never waits for replicas
                raise
        lease = Lease(
            self, token, fence, ttl_ms / 1000.0, owner=owner, granted_at=sent_at, on_lost=on_lost
        )
        if self.renew if renew is None else renew:
            from .renewal import keep_alive

            keep_alive(lease, max_hold=max_hold)
        return lease


_process = (0, "")


def fresh_token(client: RedisClient | None = None) -> tuple[str, str]:
    """A fresh unguessable token (128 bits from ``secrets``) ended by ``.<tag>``, the
    tag of this process: wake-ups for the token are published on ``<channel>:<tag>``
    (see ``notify`` in lib_lock.lua), so only this process's subscriber reads them.
    With ``client``, the tag also says how the process listens for that client's
    wake-ups (``s<tag>``: sharded pub/sub, see :mod:`.pubsub`)."""
    global _process
    pid = current_pid()
    if _process[0] != pid:  # first call, or a forked child: a tag of its own
        _process = (pid, secrets.token_hex(4))
    tag = _process[1] if client is None else pubsub_mode(client).tag_prefix + _process[1]
    return f"{secrets.token_hex(16)}.{tag}", tag


class ServerPrimitive(Primitive):
    """A sync lock or semaphore on one Redis server (not Redlock's majority): the
    lease's requests as the operations of ``_scripts`` (see :mod:`.operations`), run
    on the client."""

    _scripts: PrimitiveOperations

    def _release_token(self, token: str) -> bool:
        return run(self._client, self._scripts.release(token))

    def _extend_token(self, token: str, ttl_ms: int, gen: int = 0) -> bool:
        return run(self._client, self._scripts.extend(token, ttl_ms, gen))

    def _held_token(self, token: str) -> int:
        return run(self._client, self._scripts.held(token))

    def _add_to_token(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> int:
        return run(self._client, self._scripts.extend_add(token, ttl_ms, nonce, gen))

    def _leave(self, token: str) -> int:
        """Take waiter ``token`` out of the queue; the fence of a lease granted to it
        meanwhile, else 0."""
        return run(self._client, self._scripts.leave(token))

    def _revoke(self, token: str) -> bool:
        """An operator's release of lease ``token`` (``release_all``): True when it was
        live; its holder's own release then answers False and reports it lost."""
        return run(self._client, self._scripts.revoke(token))

    def _release_owner(self, owner: str) -> int:
        return run(self._client, self._scripts.release_owner(owner))
