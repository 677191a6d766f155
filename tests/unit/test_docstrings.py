"""Every public module, class and function of the package has a docstring."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import typing

import pytest

import celery_redislock

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(celery_redislock.__path__, "celery_redislock.")
    if ".lua" not in info.name
    # The asyncio twin refuses to import before 3.11 (an ImportError naming why).
    and (sys.version_info >= (3, 11) or not info.name.startswith("celery_redislock.asyncio"))
)


@pytest.mark.parametrize("name", MODULES)
def test_public_objects_are_documented(name: str) -> None:
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip()
    # A package's __init__ gathers its modules' names; the glue's modules re-export none.
    strict = not hasattr(module, "__path__") and name.startswith("celery_redislock.celery.")
    for public in getattr(module, "__all__", ()):
        obj = getattr(module, public)
        # A type alias (Callable[...], tuple[...]) is no class, though 3.10's isclass says so.
        alias = typing.get_origin(obj) is not None
        if inspect.isfunction(obj) or (inspect.isclass(obj) and not alias):
            assert (obj.__doc__ or "").strip(), f"{name}.{public}"
            if strict:
                assert obj.__module__ == module.__name__, f"{name}.{public} is re-exported"
