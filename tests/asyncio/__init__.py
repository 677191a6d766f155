"""The asyncio twin's tests. It needs Python 3.11+ (importing ``celery_redislock.asyncio``
raises ImportError on 3.10, naming why): on 3.10 every module here is skipped, however
the tests are selected (a package's ``__init__`` runs before each of its modules)."""

import sys

import pytest

if sys.version_info < (3, 11):
    pytest.skip("celery_redislock.asyncio needs Python 3.11+", allow_module_level=True)
