"""Redlock: one lock over N independent Redis masters, granted by a majority.

``lock.py`` the lock (acquire, release, extend, held, operators' calls); ``wait.py``
a blocking acquire; ``rounds.py`` one round of a script on every master, counted
against the majority; ``fanout.py`` the parallel fan-out over ``masters.py``, the
masters' own connections; ``lease.py`` the lease and its renewal.
Imports the core and redis-py only.
"""

from __future__ import annotations

from .lease import RedlockLease
from .lock import FENCE_LEAD_US, RedlockLock

__all__ = ["FENCE_LEAD_US", "RedlockLease", "RedlockLock"]
