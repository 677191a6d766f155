"""Every public module, class and function of the Celery glue has a docstring."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "binding", "canonical", "cleanup", "client", "config", "decorators", "duplicates", "enqueue",
    "execution", "leases", "options", "signals", "signature", "singleton", "task", "tokens",
]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_public_objects_are_documented(name: str) -> None:
    module = importlib.import_module(f"celery_redislock.celery.{name}")
    assert (module.__doc__ or "").strip()
    for public in module.__all__:
        obj = getattr(module, public)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), f"{name}.{public}"
            assert obj.__module__ == module.__name__, f"{name}.{public} is re-exported"
