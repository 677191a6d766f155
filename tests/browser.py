"""A headless Chromium driven through chromedriver's W3C WebDriver HTTP API (urllib
only: no Selenium), for the live page's tests (#27) and the documentation site's
(#28). Chromium and chromedriver come from the system packages (Debian:
``apt-get install chromium chromium-driver``)."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """One chromedriver process and one headless Chromium session."""

    def __init__(
        self, width: int = 1200, height: int = 800, extra_args: tuple[str, ...] = ()
    ) -> None:
        assert CHROMIUM and CHROMEDRIVER
        port = _free_port()
        self._driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        options = {
            "binary": CHROMIUM,
            "args": [
                "--headless=new",
                "--no-sandbox",  # the tests may run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--window-size={width},{height}",
                *extra_args,
            ],
        }
        reply = self._call(
            "POST",
            "/session",
            {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}},
            timeout=60,
        )
        self._session = f"/session/{reply['sessionId']}"

    def _call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(self._base + path, data, headers, method=method)
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.load(reply)["value"]

    def get(self, url: str) -> None:
        """Open ``url``."""
        self._call("POST", f"{self._session}/url", {"url": url})

    def run(self, script: str) -> Any:
        """Evaluate ``script`` (a function body: ``return ...``) in the page."""
        return self._call("POST", f"{self._session}/execute/sync", {"script": script, "args": []})

    def wait_for(self, script: str, what: str, timeout: float = 30) -> Any:
        """Evaluate ``script`` until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.run(script)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} (last: {value!r})")

    def screenshot(self) -> bytes:
        """The viewport as PNG."""
        return base64.b64decode(self._call("GET", f"{self._session}/screenshot"))

    def close(self) -> None:
        """End the session and chromedriver."""
        with contextlib.suppress(OSError):
            self._call("DELETE", self._session)
        self._driver.terminate()
        try:
            self._driver.wait(10)
        except subprocess.TimeoutExpired:
            self._driver.kill()
            self._driver.wait()


def poll(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()`` once truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
