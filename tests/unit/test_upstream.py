"""Each private name of another library that ``celery/upstream.py`` uses still
exists: an upgrade that removes one fails here, loudly, instead of the workaround
silently doing nothing."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.app.task import Task
from kombu.transport import redis as kombu_redis

from celery_redislock.celery import upstream
from celery_redislock.celery.upstream import DUMP_PYDANTIC


def test_kombu_redis_channel_still_has_connparams() -> None:
    assert callable(getattr(kombu_redis.Channel, upstream.CONNPARAMS))


def test_a_worker_request_still_has_its_run_context() -> None:
    # A cached property of the class: present without a message to build one from.
    from celery.worker.request import Request

    assert upstream.REQUEST_CONTEXT in vars(Request)


def test_a_worker_request_without_its_context_raises() -> None:
    class Renamed:  # what an upgrade that renamed it would hand us
        pass

    with pytest.raises(AttributeError, match=upstream.REQUEST_CONTEXT):
        upstream.request_context(Renamed())  # type: ignore[arg-type]


def test_celery_tasks_still_carry_the_pydantic_dumper() -> None:
    # None on a task without pydantic=True; what pydantic=True sets is exercised in
    # tests/unit/singleton/test_signature.py (pydantic is not a test dependency).
    app = Celery("upstream", set_as_current=False)

    # lazy=False: the task now, without finalizing the app (which would register
    # every shared task other tests left behind).
    @app.task(shared=False, lazy=False)
    def plain(a: int) -> None: ...

    assert DUMP_PYDANTIC in vars(type(plain))  # set by app.task itself
    assert getattr(Task, upstream.DUMP_PYDANTIC) is None
    assert upstream.pydantic_dumper(plain) is None


def test_a_vanished_name_raises_instead_of_being_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("upstream", set_as_current=False)

    @app.task(shared=False, lazy=False)
    def plain() -> None: ...

    monkeypatch.delattr(type(plain), upstream.DUMP_PYDANTIC)
    monkeypatch.delattr(Task, upstream.DUMP_PYDANTIC)
    with pytest.raises(AttributeError):
        upstream.pydantic_dumper(plain)
    was_installed = upstream.installed()
    upstream.uninstall()
    monkeypatch.delattr(kombu_redis.Channel, upstream.CONNPARAMS)
    with pytest.raises(AttributeError):
        upstream.install()
    monkeypatch.undo()
    if was_installed:
        upstream.install()


def test_celery_configuration_still_has_the_shape_the_fingerprint_reads() -> None:
    app = Celery("upstream", set_as_current=False)
    keys = ("redislock_prefix",)
    assert upstream.conf_fingerprint(app, keys) is None  # not loaded yet: not cached
    assert app.conf.task_serializer  # loads it
    first = upstream.conf_fingerprint(app, keys)
    maps = app.conf.maps
    assert isinstance(maps, list) and isinstance(maps[0], dict)
    app.conf.update(redislock_prefix="p")  # a change at run time lands in maps[0]
    assert maps[0]["redislock_prefix"] == "p"
    assert upstream.conf_fingerprint(app, keys) != first

    class Changed:
        maps = ("not", "a", "list")

    broken = Celery("upstream", set_as_current=False)
    broken._conf = Changed()  # type: ignore[attr-defined]  # a Celery whose conf changed
    with pytest.raises(TypeError, match="no longer starts with a dict"):
        upstream.conf_fingerprint(broken, keys)
