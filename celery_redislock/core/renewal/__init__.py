"""Lease renewal: short leases kept alive while their owner lives; loss is reported.

A lease acquired with ``renew=True`` is handed to :func:`keep_alive`. Each process has
one renewer, started lazily (a scheduler thread, plus one sender thread per Redis
client that does the network calls, so a stalled Redis never delays a loss report):

* **Tick.** A lease is renewed about every TTL/3: it is due TTL/3 after the last
  renewal was *sent*, and when some lease is due every lease that is at least TTL/6
  along joins the same call, so leases settle on one shared tick.
* **Batch.** One script call per tick renews every lease of a Redis client that is
  due (``lock_renew.lua``: N keys, N tokens, N TTLs; one 1/0 reply per lease), cut
  into calls of at most :data:`MAX_BATCH` leases. In Redis Cluster every key of one
  script must share a slot, so there it is one call per *slot* with leases due.
* **Loss rule.** Each lease keeps a local deadline on the monotonic clock: the time
  the confirming request was sent plus the TTL it set. A reply of 0 (the lease
  expired, was taken over or the key is gone, e.g. after a Redis restart) marks the
  lease lost at once; errors are retried until the deadline; when the deadline
  passes without a confirming reply (Redis unreachable or paused) the lease is lost.
  Lost means :attr:`Lease.lost` is True, :attr:`Lease.lost_event` is set and
  ``on_lost(lease)`` runs, on a renewal thread (keep it short), within one tick.
* **Never past release.** :meth:`Lease.release` stops renewal before the release is
  sent; a renewal never re-creates an expired key. A lease object that is garbage
  collected without release stops being renewed and expires on its own.
* **max_hold.** ``keep_alive(lease, max_hold=s)`` never carries the lease beyond
  ``s`` seconds after its grant: the last renewal is cut short, the lease expires
  there and is reported lost ("max_hold reached").
* **Fork.** A forked child (Celery prefork) starts with no renewer and no entries:
  it never renews nor releases its parent's leases (they report ``lost`` there); the
  parent's renewer carries on.

Thread pools: works as is. **gevent / eventlet:** with the monkey-patching these
pools install, the renewal threads are greenlets. Renewal then runs only while the
task yields (network I/O, ``sleep``); a task that computes without yielding for
longer than its TTL starves the renewer, and the lease expires and is reported
lost once the task yields. Use the prefork or threads pool for CPU-bound tasks, or
a TTL longer than the longest stretch without a yield.
"""

from __future__ import annotations

import os
import threading
from typing import cast

from ...errors import ConfigurationError
from ..lease import Lease, current_pid
from ..scripts import LuaScript
from ..validate import ttl_to_ms
from .entry import Renewable, RenewalClient
from .scheduler import MAX_BATCH, Renewer

__all__ = ["MAX_BATCH", "Renewable", "Renewer", "keep_alive", "prepare", "renewer"]


_lock = threading.Lock()
_renewer: Renewer | None = None


def renewer() -> Renewer:
    """This process's renewer, created on first use (never the parent's after fork)."""
    global _renewer
    current = _renewer
    if current is None:
        with _lock:
            current = _renewer
            if current is None:
                current = _renewer = Renewer()
    return current


def prepare(client: RenewalClient) -> None:
    """An acquire with renewal is about to be sent to ``client``: the renewer opens its
    own connection to it now (see :mod:`.sender`)."""
    renewer().prepare(client)


def keep_alive(lease: Lease, *, max_hold: float | None = None) -> None:
    """Renew ``lease`` in the background until it is released, lost or collected.

    ``max_hold``: seconds after the grant beyond which renewal never carries the
    lease (it then expires and is reported lost). Raises :class:`ConfigurationError`
    when the lease's holder cannot be renewed or ``max_hold`` is not a number > 0.
    """
    if max_hold is not None:
        ttl_to_ms(max_hold, "max_hold")
    holder = lease.holder
    if not isinstance(getattr(holder, "_renew_script", None), LuaScript):
        raise ConfigurationError(f"lease holder {holder!r} does not support renewal")
    if lease._pid != current_pid() or lease.released or lease.lost or lease._stop_renewal:
        return  # another process's lease, nothing left to renew, or renewed already
    lease._stop_renewal = renewer().add(lease, cast(Renewable, holder), max_hold)


def _forget_after_fork() -> None:
    # The parent's threads do not exist in the child and its lock may be held there:
    # start from nothing. The parent's leases report themselves lost in the child.
    global _lock, _renewer
    _lock = threading.Lock()
    _renewer = None


os.register_at_fork(after_in_child=_forget_after_fork)
