"""Lease renewal: placeholder until the renewal issue lands."""

from __future__ import annotations

from .lease import Lease

__all__ = ["keep_alive"]


def keep_alive(lease: Lease) -> None:
    """Not built yet: raises rather than pretend to renew."""
    raise NotImplementedError("lease renewal is not implemented yet")
