"""Operations without I/O: what a lock or semaphore asks of Redis, written once and
driven sync, async or across Redlock masters.

An *operation* is a generator that yields :class:`Call`\\ s -- one Lua script call
each: the script, its KEYS and ARGV, and optionally a deadline for its reply -- and
is sent each call's reply (the script's payload, its stamp already checked), or has
the call's exception thrown into it. Its return value is the operation's result::

    def release(token) -> Operation[bool]:
        answer = yield Call(RELEASE, keys, [token])
        return bool(answer)

A *driver* runs an operation against a client. :func:`run` is the sync one, over a
``redis.Redis`` / ``RedisCluster`` (each call through :class:`.LuaScript`, which
keeps the EVALSHA/NOSCRIPT fallback, the stamped replies and the deadline caps);
``celery_redislock.asyncio.calls.run`` is its twin over ``redis.asyncio``. A
Redlock driver sends each call to every master and decides on the replies.

The operations themselves live with the scripts they call: one lock's in
:class:`.lock_scripts.LockScripts` (``release``, ``extend``, ``extend_add``,
``held``, ``leave``, ``adopt``, ``release_owner``, ``revoke``, ``info``), one
semaphore's in :class:`.semaphore_scripts.SemaphoreScripts`; what a lease does with
their answers (confirm, mark lost, reschedule renewal) in
:class:`.lease_state.LeaseState`. Decisions are never in a driver.

Interface, in full: :class:`Call` (``script``, ``keys``, ``args``, ``deadline``,
``sends``), :data:`Operation`, :func:`run`, :func:`reply_of` (an operation that is
one call), and :class:`PrimitiveOperations` (what a lock's or semaphore's operations
object offers).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import NamedTuple, Protocol, TypeVar

from redis.typing import EncodableT, KeyT

from .scripts import LuaScript, RedisClient, ScriptReply, reply_deadline

__all__ = ["Call", "Operation", "PrimitiveOperations", "reply_of", "run"]

T = TypeVar("T")


class Call(NamedTuple):
    """One script call an operation asks for (a tuple: one is made per call).

    ``deadline``: a ``time.monotonic()`` instant past which the driver stops waiting
    for the reply (raising :class:`~.scripts.DeadlinePassed`); None keeps whatever
    deadline the caller set around the whole operation (see
    :func:`~.scripts.reply_deadline`). ``sends``: when given, a driver that sees its
    own re-sends (:func:`~.scripts.sees_resends`) appends one item per send, so the
    operation can tell a reply to a re-sent call (see ``lock_scripts.release_reply``);
    a driver that cannot see them leaves it empty.
    """

    script: LuaScript
    keys: list[KeyT]
    args: list[EncodableT]
    deadline: float | None = None
    sends: list[None] | None = None


Operation = Generator[Call, ScriptReply, T]
"""An operation with result ``T``: yields calls, is sent their replies."""


class PrimitiveOperations(Protocol):
    """The operations of one lock or semaphore that its leases, waiters and operators
    use (``LockScripts`` and ``SemaphoreScripts`` both offer them)."""

    def release(self, token: str, deadline: float | None = None) -> Operation[bool]:
        """Give up lease ``token`` (``deadline``: judge a re-send by it, see the lock)."""
        ...

    def revoke(self, token: str) -> Operation[bool]:
        """An operator's release of lease ``token``: its holder's release then fails."""
        ...

    def extend(self, token: str, ttl_ms: int, gen: int = 0) -> Operation[bool]:
        """Set lease ``token``'s TTL; False when not live."""
        ...

    def extend_add(self, token: str, ttl_ms: int, nonce: str, gen: int = 0) -> Operation[int]:
        """Add to lease ``token``'s TTL; the ms left after, 0 when not live."""
        ...

    def held(self, token: str) -> Operation[int]:
        """The ms lease ``token`` has left, 0 when not live."""
        ...

    def leave(self, token: str) -> Operation[int]:
        """Waiter ``token`` leaves the queue; the fence of a lease granted it, else 0."""
        ...

    def release_owner(self, owner: str) -> Operation[int]:
        """Release the leases of ``owner`` ("": all); how many."""
        ...


def reply_of(call: Call) -> Operation[ScriptReply]:
    """The operation of one call whose reply is its result."""
    return (yield call)


def run(client: RedisClient, operation: Operation[T]) -> T:
    """Run ``operation`` on a sync ``client``: each call sent in turn, its reply (or
    its exception) given back to the operation; the operation's result."""
    try:
        call = next(operation)
        while True:
            try:
                if call.deadline is not None:
                    with reply_deadline(call.deadline):
                        reply = _send(client, call)
                elif call.sends is None:
                    reply = call.script(client, call.keys, call.args)
                else:
                    reply = call.script(client, call.keys, call.args, sends=call.sends)
            except Exception as exc:  # the operation decides (e.g. a waiter rides it out)
                call = operation.throw(exc)
            else:
                call = operation.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


def _send(client: RedisClient, call: Call) -> ScriptReply:
    if call.sends is None:
        return call.script(client, call.keys, call.args)
    return call.script(client, call.keys, call.args, sends=call.sends)
