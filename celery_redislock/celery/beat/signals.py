"""Signals of ``LeaderScheduler``, so users can count, log and alert on beat.

Celery signals (:class:`celery.utils.dispatch.Signal`); ``sender`` is the scheduler.
Receivers get the arguments below as keywords and must accept ``**kwargs``.

* ``beat_elected(group, owner)`` -- this beat now holds the leader lease;
* ``beat_lease_lost(group, owner, reason)`` -- it lost it and stopped sending;
* ``beat_slot_sent(entry, slot)`` -- a slot (aware UTC datetime) was claimed and sent;
* ``beat_slot_skipped(entry, slot, last)`` -- the slot was claimed already (``last``:
  the entry's last claimed slot), so it was not sent again.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["beat_elected", "beat_lease_lost", "beat_slot_sent", "beat_slot_skipped"]

beat_elected = Signal(name="beat_elected", providing_args=("group", "owner"))
beat_lease_lost = Signal(name="beat_lease_lost", providing_args=("group", "owner", "reason"))
beat_slot_sent = Signal(name="beat_slot_sent", providing_args=("entry", "slot"))
beat_slot_skipped = Signal(name="beat_slot_skipped", providing_args=("entry", "last", "slot"))
