"""The asyncio twin's tests. It needs Python 3.11+ (importing ``celery_redislock.asyncio``
raises ImportError on 3.10, naming why): on 3.10 every module here is skipped, however
the tests are selected (a package's ``__init__`` runs before each of its modules)."""

import sys

import pytest

if sys.version_info < (3, 11):
    pytest.skip("celery_redislock.asyncio needs Python 3.11+", allow_module_level=True)


def write_sizes(monkeypatch: pytest.MonkeyPatch, script: object = None) -> list[int]:
    """The sizes of the burst writes (``batch._send``) made from now on, of ``script``
    only when given; each write still goes out."""
    from typing import Any

    from celery_redislock.asyncio import batch

    sizes: list[int] = []
    send = batch._send

    async def counted(sent: Any, client: Any, items: list[Any]) -> None:
        if script is None or sent is script:
            sizes.append(len(items))
        await send(sent, client, items)

    monkeypatch.setattr(batch, "_send", counted)
    return sizes
