"""A redis-server of a test module's own, for a module that leaves the serial part.

Its tests read state that lives in the broker's Redis under fixed names -- kombu's
``unacked`` hash, the park journal of the default prefix -- and that other tests leave
behind on the shared server of their xdist worker (workers killed with messages
unacknowledged, runs journaled). Serial, they ran where no such test ran before them;
under xdist they get a server only they use::

    from ..own_redis import own_redis_url  # noqa: F401 (the fixture redis_url)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_redislock.testing import RedisServer

__all__ = ["own_redis_url"]


@pytest.fixture(scope="module", name="redis_url")
def own_redis_url() -> Iterator[str]:
    """URL of a redis-server only this module's tests use (overrides the session's)."""
    with RedisServer() as server:
        yield server.url
