"""Every public module, class and function of the package has a docstring."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import celery_redislock

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(celery_redislock.__path__, "celery_redislock.")
    if ".lua" not in info.name
)


@pytest.mark.parametrize("name", MODULES)
def test_public_objects_are_documented(name: str) -> None:
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip()
    # A package's __init__ gathers its modules' names; the glue's modules re-export none.
    strict = not hasattr(module, "__path__") and name.startswith("celery_redislock.celery.")
    for public in getattr(module, "__all__", ()):
        obj = getattr(module, public)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), f"{name}.{public}"
            if strict:
                assert obj.__module__ == module.__name__, f"{name}.{public} is re-exported"
