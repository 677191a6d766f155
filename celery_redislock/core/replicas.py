"""Replica acknowledgement of grants: ``min_replicas`` / ``replica_timeout`` /
``wait_aof`` on a lock or semaphore.

Redis replicates asynchronously: a primary that dies right after a grant may take
it with it, and the replica Sentinel promotes then grants the name again. With
``min_replicas=N`` a grant counts only once ``WAIT N timeout`` (or ``WAITAOF 1 N
timeout`` with ``wait_aof=True``: written to the primary's AOF and N replicas' AOF)
reports it acknowledged. Otherwise the lease is released again and
:class:`~celery_redislock.errors.NotReplicated` raised: the caller never holds a
lease it may not trust. Releases, extends and renewals never wait.

``WAIT`` counts the writes of the connection it is sent on, and a lease may have
been written by another client (a release that handed it to this waiter). So the
confirmation is pipelined on one connection after a write that follows the grant in
the replication stream: a first attempt sends its acquire script and ``WAIT``
together (one round trip, as without acks, when granted at once; a refused one pays
the ``WAIT`` too, at once while the replicas keep up); any other grant (a waiter's,
an adoption) sends the lease's own extend script (an owner check too) then ``WAIT``,
one more round trip.

What it does not guarantee: Sentinel promotes the replica with the largest
replication offset it knows of, which with ``min_replicas`` below the number of
replicas may be one that lacks the grant; replicas acknowledge receipt, not
persistence (``WAITAOF`` asks for an fsync); while a replica is down every grant
waits ``replica_timeout`` and fails; and nothing bounds a holder that stalls past
its TTL (fences do). Without acknowledgement, a primary cut off from its Sentinels
keeps granting to the clients that reach it until it is demoted.
"""

from __future__ import annotations

import time

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT, KeyT

from ..errors import ConfigurationError, NotReplicated
from .clients import key_node, pipelined
from .scripts import LuaScript, RedisClient, ScriptReply
from .validate import check_bool, ttl_to_ms

__all__ = ["DEFAULT_REPLICA_TIMEOUT", "ReplicaAck", "check_replica_ack", "remaining_ms"]

DEFAULT_REPLICA_TIMEOUT = 1.0
"""Seconds a grant waits for its replicas by default before it is given up."""


class ReplicaAck:
    """What a grant waits for: ``min_replicas`` replicas within ``timeout_ms``."""

    __slots__ = ("aof", "min_replicas", "timeout_ms")

    def __init__(self, min_replicas: int, timeout_ms: int, aof: bool) -> None:
        self.min_replicas = min_replicas
        self.timeout_ms = timeout_ms
        self.aof = aof

    def command(self) -> tuple[str | int, ...]:
        """The ``WAIT`` (or ``WAITAOF``) command to send after the grant's write."""
        if self.aof:
            return ("WAITAOF", 1, self.min_replicas, self.timeout_ms)
        return ("WAIT", self.min_replicas, self.timeout_ms)

    def run(
        self, client: RedisClient, script: LuaScript, keys: list[KeyT], args: list[EncodableT]
    ) -> tuple[ScriptReply, object]:
        """``script`` then the wait, pipelined on one connection (one round trip; the
        script's text after a NOSCRIPT): ``(reply, acked)``, ``acked`` as the wait
        answered (an int, WAITAOF's pair, or the error it raised)."""
        if isinstance(client, RedisCluster):
            # WAIT counts its own connection's writes: both go to the primary serving
            # the keys' slot, on one of its connections (a cluster pipeline would send
            # WAIT, which names no key, to whichever node; its replicas would answer).
            # A slot that moved meanwhile answers MOVED: an error, the caller releases.
            node = client.get_redis_connection(key_node(client, keys[0]))
        else:
            node = client
        for command in ("EVALSHA", "EVAL"):
            body = script.sha if command == "EVALSHA" else script.text
            reply, acked = pipelined(node, (command, body, len(keys), *keys, *args), self.command())
            if not isinstance(reply, NoScriptError):  # else sent again with its text
                break
        if isinstance(reply, Exception):
            raise reply
        return script.checked(reply, args), acked  # the stamped reply's payload

    def check(self, name: str, acked: object, live: bool = True) -> None:
        """Raise :class:`NotReplicated` unless ``acked`` (a wait's answer) counts
        ``min_replicas`` (and a local fsync with WAITAOF) and the lease is ``live``."""
        if isinstance(acked, ResponseError):
            raise self._unsupported(acked) from acked
        if isinstance(acked, Exception):
            raise acked
        if self.aof and isinstance(acked, list) and len(acked) == 2:
            local_ok, replicas = int(acked[0]) >= 1, int(acked[1])
        elif not self.aof and isinstance(acked, int):
            local_ok, replicas = True, acked
        else:
            raise ResponseError(f"{name!r}: unexpected reply to the replica wait: {acked!r:.200}")
        if not live or not local_ok or replicas < self.min_replicas:
            what = "WAITAOF" if self.aof else "WAIT"
            state = "" if live else " (and the lease was no longer live)"
            raise NotReplicated(
                f"{name!r}: the grant was acknowledged by {replicas} of min_replicas="
                f"{self.min_replicas} replicas{'' if local_ok else ' (not fsynced locally)'}"
                f" within replica_timeout={self.timeout_ms / 1000:g}s ({what}){state}; "
                "the lease was released",
                name,
                self.min_replicas,
                replicas,
            )

    def confirm(
        self,
        client: RedisClient,
        name: str,
        script: LuaScript,
        keys: list[KeyT],
        args: list[EncodableT],
    ) -> None:
        """Run the lease's extend ``script`` and the wait on one connection; raise
        :class:`NotReplicated` when too few replicas acknowledged or the lease was no
        longer live. The caller releases the lease on any exception."""
        live, acked = self.run(client, script, keys, args)
        self.check(name, acked, bool(live))

    def _unsupported(self, error: ResponseError) -> Exception:
        text = str(error)
        if self.aof and "unknown command" in text.lower():
            return ConfigurationError(
                f"wait_aof=True needs WAITAOF (Redis >= 7.2); this server answered: {text}"
            )
        if self.aof and "appendonly" in text.lower():
            return ConfigurationError(
                f"wait_aof=True needs appendonly yes on the primary; this server answered: {text}"
            )
        return error

    def __repr__(self) -> str:
        return f"<ReplicaAck min_replicas={self.min_replicas} timeout_ms={self.timeout_ms}" + (
            " aof>" if self.aof else ">"
        )


def check_replica_ack(
    client: RedisClient, min_replicas: object, replica_timeout: object, wait_aof: object
) -> ReplicaAck | None:
    """The checked acknowledgement settings; None when ``min_replicas`` is 0 and
    ``wait_aof`` False (the default: grants count at once). Bad values raise
    :class:`ConfigurationError` naming the argument and the value."""
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise ConfigurationError(f"min_replicas must be an int >= 0, got {min_replicas!r}")
    # WAIT 0 would block for ever: a grant must never wait unbounded.
    timeout_ms = ttl_to_ms(replica_timeout, "replica_timeout")
    aof = check_bool(wait_aof, "wait_aof")
    if min_replicas == 0 and not aof:
        return None
    if isinstance(client, RedisCluster):
        socket_timeout = client.nodes_manager.connection_kwargs.get("socket_timeout")
    else:
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    if socket_timeout is not None and socket_timeout * 1000 <= timeout_ms:
        # The client would give up on the reply before WAIT answers (a TimeoutError
        # instead of NotReplicated, and the lease left behind until its TTL).
        raise ConfigurationError(
            f"replica_timeout must be shorter than the client's socket_timeout "
            f"({socket_timeout!r}), got {replica_timeout!r}"
        )
    return ReplicaAck(min_replicas, timeout_ms, aof)


def remaining_ms(ttl_ms: int, sent_at: float) -> int:
    """What is left of a ``ttl_ms`` lease granted to a request sent at ``sent_at``:
    the confirmation's extend keeps the server's expiry where the grant put it."""
    return max(1, ttl_ms - int((time.monotonic() - sent_at) * 1000))
