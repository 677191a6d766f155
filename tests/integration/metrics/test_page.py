"""The exporter's live page in a real headless Chromium (#27): it renders, shows a
lock a test holds and a pool with its backlog, and updates by itself when the lock
is released. Chromium and chromedriver come from the system packages
(``apt-get install chromium chromium-driver``; .ci/run installs them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_redislock import RedisLock
from celery_redislock.celery.metrics.server import Exporter

from ...browser import CHROMEDRIVER, CHROMIUM, Browser

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Chromium and chromedriver from the system packages "
        "(apt-get install -y chromium chromium-driver)",
    ),
    pytest.mark.serial,  # a browser: heavy on a 2-core machine
]

LOCK_ROW = "return document.querySelector('#locks tr[data-lock=\"{name}\"]') !== null;"


@pytest.fixture
def exporter(r: redis.Redis) -> Iterator[Exporter]:
    running = Exporter(r, "redislock", host="127.0.0.1", port=0).start()
    yield running
    running.stop()


@pytest.fixture
def browser() -> Iterator[Browser]:
    opened = Browser()
    yield opened
    opened.close()


def test_page_shows_a_held_lock_and_updates_when_released(
    exporter: Exporter, browser: Browser, r: redis.Redis
) -> None:
    lock = RedisLock(r, "report:daily", ttl=60)
    lease = lock.acquire(blocking=False)
    assert lease is not None
    browser.get(f"http://127.0.0.1:{exporter.port}/?refresh=0.3")
    assert browser.run("return document.title;") == "celery_redislock"
    browser.wait_for(LOCK_ROW.format(name="report:daily"), "the held lock's row")
    held = browser.run("return document.getElementById('locks-held').textContent;")
    assert held == "1"
    row = browser.run(
        "return document.querySelector('#locks tr[data-lock=\"report:daily\"]').innerText;"
    )
    assert "report:daily" in row and lease.token[:8] in row  # no owner id: the token shown

    assert lease.release()
    # The same page, not reloaded: its own refresh shows the lock gone.
    browser.wait_for(
        "return document.getElementById('locks-held').textContent === '0' && "
        + LOCK_ROW.format(name="report:daily").replace("return ", "!(").rstrip(";")
        + ");",
        "the released lock gone from the page",
    )
    if os.environ.get("REDISLOCK_SCREENSHOT"):  # docs/img/live-page.png is taken so
        Path(os.environ["REDISLOCK_SCREENSHOT"]).write_bytes(browser.screenshot())


def test_page_says_so_when_redis_is_unreachable(browser: Browser) -> None:
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry_on_error=[])
    down = Exporter(client, "redislock", host="127.0.0.1", port=0).start()
    try:
        browser.get(f"http://127.0.0.1:{down.port}/?refresh=0.3")
        status = browser.wait_for(
            "const s = document.getElementById('status');"
            "return s.className === 'error' ? s.textContent : null;",
            "the page's error status",
        )
        assert "cannot read" in status
    finally:
        down.stop()
