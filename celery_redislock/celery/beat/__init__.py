"""Beat on several hosts: ``LeaderScheduler`` (a leader lease, per-slot claims), its
settings, slots, claims, election and signals. Imports the core and the shared modules.
"""

from __future__ import annotations

from .scheduler import LeaderScheduler

__all__ = ["LeaderScheduler"]
