"""Singleton keys: one job, one key, whatever the spelling; the same on both sides."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task
from celery.contrib.testing.worker import start_worker

from celery_redislock.celery.singleton.canonical import DIGEST_LENGTH
from celery_redislock.celery.singleton.signature import call_key, received_key, serializer_for
from celery_redislock.errors import ConfigurationError

_MISSING = object()


@pytest.fixture
def app() -> Iterator[Celery]:
    # Tasks are made with shared=False: a shared task would be registered in every
    # later app too, and the suite turns the duplicate-name warning into an error.
    app = Celery("unit", set_as_current=False, broker="memory://", backend="cache+memory://")
    yield app
    app.close()


def test_spellings_of_one_call_have_one_key(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int, b: int = 2) -> None: ...

    keys = {
        call_key(f, (1,)),
        call_key(f, (), {"a": 1}),
        call_key(f, (1, 2)),
        call_key(f, (1,), {"b": 2}),
        call_key(f, (), {"b": 2, "a": 1}),
        call_key(f, [1], None),
    }
    assert len(keys) == 1
    assert call_key(f, (1, 3)) not in keys
    assert call_key(f, (2,)) not in keys


def test_kwargs_order_and_var_arguments(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int, *rest: int, **extra: Any) -> None: ...

    assert call_key(f, (1,), {"x": 1, "y": 2}) == call_key(f, (), {"y": 2, "a": 1, "x": 1})
    assert call_key(f, (1, 2, 3)) != call_key(f, (1, 3, 2))
    assert call_key(f, (1,), {"x": 1}) != call_key(f, (1,), {"x": 2})
    assert call_key(f, (1,), {"x": 1}) != call_key(f, (1, 1))


def test_key_is_task_name_and_bounded_digest_without_raw_arguments(app: Celery) -> None:
    @app.task(shared=False, name="app.send_mail")
    def send_mail(address: str, body: str) -> None: ...

    key = call_key(send_mail, ("alice@example.com", "x" * 100_000))
    name, _, digest = key.rpartition(":")
    assert name == "app.send_mail"
    assert len(digest) == DIGEST_LENGTH
    assert int(digest, 16) >= 0
    assert "alice" not in key


def test_same_arguments_of_two_tasks_differ(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int) -> None: ...

    @app.task(shared=False)
    def g(a: int) -> None: ...

    assert call_key(f, (1,)) != call_key(g, (1,))


def test_values_normalised_through_json(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: Any, b: Any = None) -> None: ...

    assert call_key(f, ((1, 2),)) == call_key(f, ([1, 2],))  # json: tuple -> list
    assert call_key(f, ({1: "x"},)) == call_key(f, ({"1": "x"},))  # json: int key -> str
    assert call_key(f, (1,)) != call_key(f, ("1",))
    assert call_key(f, (1,)) != call_key(f, (True,))
    assert call_key(f, ([1, 2],)) != call_key(f, ({"l": 1, "x": 2},))


def test_bind_true_and_class_based_tasks_skip_self(app: Celery) -> None:
    @app.task(shared=False, bind=True)
    def bound(self: Task[Any, Any], a: int, b: int = 2) -> None: ...

    class ClassBased(Task[Any, Any]):
        name = "unit.class_based"

        def run(self, a: int, b: int = 2) -> None: ...

    class_based = app.register_task(ClassBased())
    for task in (bound, class_based):
        assert call_key(task, (1,)) == call_key(task, (), {"a": 1, "b": 2})
        with pytest.raises(TypeError, match="missing a required argument: 'a'"):
            call_key(task, (), {"b": 1})


def test_arguments_that_do_not_bind_raise_type_error(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int) -> None: ...

    with pytest.raises(TypeError, match=r"unit\..*f\(\): missing"):
        call_key(f)
    with pytest.raises(TypeError, match="too many positional arguments"):
        call_key(f, (1, 2))
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        call_key(f, (1,), {"z": 1})
    with pytest.raises(TypeError, match="list or tuple"):
        call_key(f, "a")


def test_unencodable_argument_names_the_argument(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int, blob: Any = None) -> None: ...

    with pytest.raises(ConfigurationError, match=r"argument 'blob' of task .*'json'"):
        call_key(f, (1, object()))


def test_unencodable_default_is_fine(app: Celery) -> None:
    @app.task(shared=False)
    def f(a: int, marker: Any = _MISSING) -> None: ...

    assert call_key(f, (1,)) == call_key(f, (), {"a": 1})
    assert call_key(f, (1,)) != call_key(f, (1, None))


def test_unique_on_picks_arguments(app: Celery) -> None:
    @app.task(shared=False, unique_on=["user"])
    def f(user: int, note: str = "") -> None: ...

    @app.task(shared=False, unique_on="user")
    def g(user: int, note: str = "") -> None: ...

    assert call_key(f, (1, "a")) == call_key(f, (1, "b")) == call_key(f, (), {"user": 1})
    assert call_key(f, (1,)) != call_key(f, (2,))
    assert call_key(g, (1, "a")) == call_key(g, (1, "b"))
    assert call_key(f, (1, object())) == call_key(f, (1,))  # excluded: never encoded


def test_unique_on_empty_makes_one_job_per_task(app: Celery) -> None:
    @app.task(shared=False, unique_on=[])
    def f(a: int) -> None: ...

    assert call_key(f, (1,)) == call_key(f, (2,))


def test_unique_on_reads_var_kwargs(app: Celery) -> None:
    @app.task(shared=False, unique_on=["tenant"])
    def f(a: int, **extra: Any) -> None: ...

    assert call_key(f, (1,), {"tenant": "t1"}) == call_key(f, (2,), {"tenant": "t1", "x": 1})
    assert call_key(f, (1,), {"tenant": "t1"}) != call_key(f, (1,), {"tenant": "t2"})
    assert call_key(f, (1,)) != call_key(f, (1,), {"tenant": None})


@pytest.mark.parametrize(
    ("unique_on", "message"),
    [
        (["usr"], r"unique_on of task '.*' names 'usr', which is not an argument of .*\(user"),
        (5, "unique_on of task '.*' must be a list of argument names, got 5"),
        ([1], r"must be a list of argument names, got \[1\]"),
        ({"user": 1}, "must be a list of argument names"),
    ],
)
def test_bad_unique_on_is_named(app: Celery, unique_on: Any, message: str) -> None:
    @app.task(shared=False, unique_on=unique_on)
    def f(user: int) -> None: ...

    with pytest.raises(ConfigurationError, match=message):
        call_key(f, (1,))


def test_lock_key_gives_the_whole_key(app: Celery) -> None:
    seen: list[tuple[Any, ...]] = []

    def key(a: Any, b: int = 0) -> str:
        seen.append((a, b))
        return f"report:{a[0]}"

    @app.task(shared=False, lock_key=key)
    def f(a: Any, b: int = 0) -> None: ...

    assert call_key(f, ((7, 8),), {"b": 1}) == "report:7"
    assert seen == [([7, 8], 1)]  # called as the worker will be: tuple arrives as list
    assert received_key(f, [[7, 8]], {"b": 1}) == "report:7"


def test_lock_key_errors(app: Celery) -> None:
    @app.task(shared=False, lock_key=lambda a: a)
    def f(a: Any) -> None: ...

    @app.task(shared=False, lock_key="fixed")
    def g(a: Any) -> None: ...

    @app.task(shared=False, lock_key=lambda a: "k", unique_on=["a"])
    def h(a: Any) -> None: ...

    with pytest.raises(ConfigurationError, match=r"lock_key of task .* non-empty string, got 3"):
        call_key(f, (3,))
    with pytest.raises(ConfigurationError, match=r"task .*g': option lock_key must be callable"):
        call_key(g, (3,))
    with pytest.raises(ConfigurationError, match="argument 'a' of task"):
        call_key(f, (object(),))
    with pytest.raises(ConfigurationError, match="sets both unique_on and lock_key"):
        call_key(h, (1,))


def test_lock_key_through_task_annotations(app: Celery) -> None:
    app.conf.task_annotations = {"unit.annotated": {"lock_key": lambda a: f"k{a}"}}

    @app.task(shared=False, name="unit.annotated")
    def annotated(a: int) -> None: ...

    assert call_key(annotated, (1,)) == "k1"


def test_serializer_choice(app: Celery) -> None:
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]

    @app.task(shared=False)
    def f(a: Any) -> None: ...

    @app.task(shared=False, serializer="json")
    def g(a: Any) -> None: ...

    assert serializer_for(f) == "pickle"
    assert serializer_for(g) == "json"
    assert serializer_for(g, {"serializer": "pickle"}) == "pickle"
    when = datetime.date(2024, 1, 2)
    assert call_key(f, ({1: when},)) != call_key(f, ({"1": when},))  # pickle keeps int keys
    assert call_key(g, ({1: when},)) == call_key(g, ({"1": when},))
    with pytest.raises(ConfigurationError, match="argument 'a'"):
        call_key(f, (object(),))  # pickles, but has no stable key
    with pytest.raises(ConfigurationError, match="no-such"):
        call_key(g, (1,), {}, {"serializer": "no-such"})


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((), {"a": 1, "b": (1, 2)}),
    (((1, (2, 3)),), {"b": {"x": [1, 2], "y": None}}),
    (("é", decimal.Decimal("1.10")), {}),
    ((datetime.datetime(2024, 1, 2, 3, 4, 5), uuid.UUID(int=5)), {}),
    ((b"\x00\xff",), {"b": {1: 2}}),
]


def test_worker_computes_the_producers_key(app: Celery) -> None:
    """A real worker (in-memory broker) recomputes each key from request.args/kwargs."""
    app.conf.update(
        accept_content=["json", "pickle"],
        result_serializer="json",
        task_default_queue="keys",
        broker_transport_options={"polling_interval": 0.01},
    )

    @app.task(shared=False, bind=True, serializer="json")
    def echo_json(self: Task[Any, Any], a: Any, b: Any = "default") -> str:
        return received_key(self, self.request.args, self.request.kwargs)

    @app.task(shared=False, bind=True, serializer="pickle")
    def echo_pickle(self: Task[Any, Any], a: Any, b: Any = "default") -> str:
        return received_key(self, self.request.args, self.request.kwargs)

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        for task in (echo_json, echo_pickle):
            for args, kwargs in CALLS:
                result = task.apply_async(args, kwargs)
                expected = call_key(task, args, kwargs)
                assert result.get(timeout=10, interval=0.01) == expected, (task, args, kwargs)


def test_eager_apply_async_computes_the_producers_key(app: Celery) -> None:
    app.conf.task_always_eager = True

    @app.task(shared=False, bind=True)
    def echo(self: Task[Any, Any], a: Any, b: Any = "default") -> str:
        return received_key(self, self.request.args, self.request.kwargs)

    for args, kwargs in CALLS[:3]:
        assert echo.apply_async(args, kwargs).get() == call_key(echo, args, kwargs)


def test_models_are_dumped_as_apply_async_does(app: Celery) -> None:
    # pydantic=True tasks dump their models before sending unless the *call* asks for
    # pickle (celery's Task.apply_async); the task's own serializer does not matter.
    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

    @app.task(shared=False, serializer="pickle")
    def f(p: Any) -> None: ...

    job = app.tasks[f.name]
    job._dump_pydantic_arguments = staticmethod(  # what pydantic=True installs
        lambda args, kwargs: ([{"x": a.x} if isinstance(a, Point) else a for a in args], kwargs)
    )
    assert call_key(job, (Point(1),)) == received_key(job, ({"x": 1},), {})
    with pytest.raises(ConfigurationError, match="argument 'p'"):
        call_key(job, (Point(1),), {}, {"serializer": "pickle"})  # sent as the object
