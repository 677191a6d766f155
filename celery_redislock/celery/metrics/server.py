"""The exporter's HTTP server: ``/metrics`` (Prometheus), ``/`` (the live page) and
``/state.json`` (what the page shows) (#27).

A ``ThreadingHTTPServer`` of the standard library: each request reads Redis itself
(one scrape, one read), nothing is cached between requests. The page is one static
file (``page.html``) with its own script and no external resource; it fetches
``state.json`` every 2 s (``?refresh=SECONDS`` to change it).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from typing import Any, Final
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ...core.scripts import RedisClient
from .collector import RedisLockCollector
from .read import DEFAULT_LOCK_DETAILS, DEFAULT_MAX_NAMES, read_state

__all__ = ["DEFAULT_PORT", "Exporter"]

logger = logging.getLogger("celery_redislock.metrics")

DEFAULT_PORT: Final = 10057
"""The exporter's default port, beyond the 9100-9999 range the Prometheus project's
"default port allocations" list has filled, where new exporters now take theirs."""


class Exporter:
    """Serves one Redis's metrics and page on ``host:port`` (``start``/``stop``,
    or ``serve_forever`` in the foreground)."""

    def __init__(
        self,
        client: RedisClient,
        prefix: str,
        *,
        host: str = "",
        port: int = DEFAULT_PORT,
        max_names: int = DEFAULT_MAX_NAMES,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.max_names = max_names
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RedisLockCollector(client, prefix, max_names=max_names))
        self.page = files(__package__).joinpath("page.html").read_bytes()
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when 0 was asked for)."""
        return int(self.server.server_address[1])

    def state_json(self) -> bytes:
        """The page's data: the gauges and the first held locks, as JSON."""
        state = read_state(
            self.client, self.prefix, max_names=self.max_names, lock_details=DEFAULT_LOCK_DETAILS
        )
        return json.dumps(state.to_json()).encode()

    def start(self) -> Exporter:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="celery_redislock-exporter", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self.server.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(5)


def _handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            try:
                if path == "/metrics":
                    self._reply(200, CONTENT_TYPE_LATEST, generate_latest(exporter.registry))
                elif path == "/state.json":
                    self._reply(200, "application/json", exporter.state_json())
                elif path in ("/", "/index.html"):
                    self._reply(200, "text/html; charset=utf-8", exporter.page)
                else:
                    self._reply(404, "text/plain", b"not found\n")
            except Exception as exc:  # Redis down: say so, keep serving
                logger.warning("celery_redislock exporter: %s: %s", path, exc)
                self._reply(503, "text/plain", f"cannot read Redis: {exc}\n".encode())

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("celery_redislock exporter: " + format, *args)

    return Handler
