"""A workaround, in the worker's main process, for a worker exit on a broker outage.

On a lost broker connection celery 5.7's consumer first ``collect()``\\ s the
connection (which closes its transport: ``transport.client`` becomes None) and then
``close()``\\ s it; the second close closes the default channel again, whose QoS
tries once more to restore the messages it still holds unacknowledged (prefetched,
or one whose ack the outage broke). kombu's Redis channel then builds a connection
pool from ``transport.client`` and fails with ``AttributeError: 'NoneType' object has
no attribute 'hostname'`` (the traceback of celery/kombu#582), which is not one of
the connection errors celery ignores there: ``Unrecoverable error``, the worker exits.
Plain celery meets it whenever a message is unacknowledged at that moment (always
with countdown/ETA messages); a worker whose runs are parked or waiting out the
outage meets it as well.

The fix: a channel whose transport was collected raises the transport's own
``ConnectionError`` instead, which ``close()`` ignores, as it ignores the same
failure on the first close. The messages stay in the broker's unacked set, where
kombu restores them after ``visibility_timeout`` as it always has; nothing else
changes. Installed by :func:`connect` on ``worker_init`` (never in a client).
"""

from __future__ import annotations

from typing import Any

import redis
from celery import signals

__all__ = ["connect", "install"]

_ATTRIBUTE = "_celery_redislock_collected_guard"


def install() -> bool:
    """Patch kombu's Redis channel (once); False when kombu has no such channel."""
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # pragma: no cover - kombu[redis] is a dependency
        return False
    channel = kombu_redis.Channel
    if getattr(channel, _ATTRIBUTE, False):
        return True
    original = getattr(channel, "_connparams")  # noqa: B009  # private in kombu's stubs

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if getattr(self.connection, "client", None) is None:
            raise redis.ConnectionError("the broker connection was closed (transport collected)")
        return original(self, asynchronous=asynchronous)

    setattr(channel, "_connparams", _connparams)  # noqa: B010
    setattr(channel, _ATTRIBUTE, True)
    return True


def _on_worker_init(**_: Any) -> None:
    install()


def connect() -> None:
    """Install the fix in every worker's main process as it starts (idempotent)."""
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_redislock.kombu_fix"
    )
