"""A background thread per app in each worker's main process: started once per app
when the worker starts, poked when there is work now, stopped when the worker stops.

The rate pump (:mod:`.ratelimit.pump`) and the parking sweeper
(:mod:`.bounded.sweeper`) are such threads: an :class:`AppThread` each, kept by a
:class:`PerApp` registry that starts one on a worker signal and stops it again when the
worker stops -- at ``worker_shutdown`` (a warm shutdown) and at Celery's
``test_worker_stopped``: an in-process worker (``celery.contrib.testing``'s
``start_worker``) ends by a cold shutdown, which sends no ``worker_shutdown``, and its
process lives on, so without it the thread kept running after the worker (#30). A
real worker's cold shutdown needs nothing: its process exits, and the thread is a
daemon.

May import Celery only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from celery import Celery, signals
from celery.utils.dispatch import Signal

__all__ = ["AppThread", "PerApp"]

JOIN_TIMEOUT = 5.0
"""Seconds a stopping worker waits at most for a thread to end its current round."""


class AppThread(threading.Thread):
    """A daemon thread working for one app in rounds; :meth:`sleep` between them ends
    early on :meth:`poke` or :meth:`stop`."""

    def __init__(self, app: Celery, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.app = app
        self._stop_event, self._poked = threading.Event(), threading.Event()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called: :meth:`run` should return."""
        return self._stop_event.is_set()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (none when not positive), less when poked or stopped."""
        if seconds > 0:
            self._poked.wait(seconds)
        self._poked.clear()

    def poke(self) -> None:
        """Work now: end the current :meth:`sleep`."""
        self._poked.set()

    def stop(self) -> None:
        """Stop after the current round."""
        self._stop_event.set()
        self._poked.set()


_T = TypeVar("_T", bound=AppThread)


class PerApp(Generic[_T]):
    """At most one thread ``make(app)`` per app in this process, started on a worker
    signal (:meth:`connect`) and stopped when the worker stops. ``make`` returns None
    for an app that needs no thread; what it raises goes to the signal's sender."""

    def __init__(self, name: str, make: Callable[[Celery], _T | None]) -> None:
        self.name, self._make = name, make
        self._threads: dict[int, _T] = {}
        self._guard = threading.Lock()

    def running(self, app: Celery) -> _T | None:
        """This process's thread of ``app``, if one runs."""
        return self._threads.get(id(app))

    def poke(self, app: Celery) -> None:
        """Ask this process's thread of ``app`` (if any) to work now."""
        thread = self.running(app)
        if thread is not None:
            thread.poke()

    def start(self, app: Celery) -> None:
        """Start the thread of ``app`` unless one runs or it needs none."""
        with self._guard:
            if id(app) in self._threads:
                return
            thread = self._make(app)
            if thread is None:
                return
            self._threads[id(app)] = thread
        thread.start()

    def stop(self, app: Celery) -> None:
        """Stop the thread of ``app`` (if any) and wait for it (at most
        :data:`JOIN_TIMEOUT`)."""
        with self._guard:
            thread = self._threads.pop(id(app), None)
        if thread is not None:
            thread.stop()
            thread.join(timeout=JOIN_TIMEOUT)

    def connect(self, start_on: Signal) -> None:
        """Start a thread at ``start_on`` (a worker signal whose sender has the
        ``app``), stop it when the worker stops; idempotent."""
        uid = f"celery_redislock.{self.name}"
        start_on.connect(self._on_start, weak=False, dispatch_uid=f"{uid}.start")
        signals.worker_shutdown.connect(self._on_shutdown, weak=False, dispatch_uid=f"{uid}.stop")

    def _on_start(self, sender: object = None, **_: object) -> None:
        app = getattr(sender, "app", None)  # a WorkController or a Consumer
        if app is None:
            return
        # Imported once a worker starts, not at connect(): a client process does not
        # need Celery's testing module (some 200 modules). Idempotent (dispatch_uid).
        from celery.contrib.testing.worker import test_worker_stopped

        test_worker_stopped.connect(
            self._on_test_stopped, weak=False, dispatch_uid=f"celery_redislock.{self.name}.test"
        )
        self.start(app)

    def _on_shutdown(self, sender: object = None, **_: object) -> None:
        app = getattr(sender, "app", None)  # the WorkController
        if app is not None:
            self.stop(app)

    def _on_test_stopped(self, sender: object = None, **_: object) -> None:
        if isinstance(sender, Celery):  # start_worker sends the app itself
            self.stop(sender)
