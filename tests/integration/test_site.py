"""The documentation site, built and opened page by page in a headless Chromium (#28):
``mkdocs build --strict`` proves the links resolve, not that a reader sees a page.
Each page in the nav must load with its title, show its heading and text (not the
404 page), every image on it must have decoded (``naturalWidth > 0``), and no Sphinx
role of a docstring (``:class:`X```) may reach the visible text raw.

Needs the docs extra (``pip install -e ".[docs]"``, which .ci/run installs before
the tests) and Chromium with chromedriver; skips without them."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ..browser import CHROMEDRIVER, CHROMIUM, Browser

pytest.importorskip("mkdocs", reason='the docs extra: pip install -e ".[docs]"')
yaml = pytest.importorskip("yaml")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Chromium and chromedriver from the system packages "
        "(apt-get install -y chromium chromium-driver)",
    ),
    pytest.mark.serial,  # a browser: heavy on a 2-core machine
]

ROOT = Path(__file__).resolve().parents[2]
# A role as docstrings write it; in the page the backticks have become <code>, so the
# visible text reads ":class:Lease" -- either form is a role nobody resolved.
RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const|ref):`?[\w.~]")
# The page as the reader sees it, once it and its images have loaded; ``prose`` is its
# text without the code that shows a role on purpose (docs/development.md names them).
PAGE = """
const prose = (article) => {
  if (!article) return '';
  const copy = article.cloneNode(true);
  copy.querySelectorAll('code').forEach(c => { if (/:\\w+:`/.test(c.textContent)) c.remove(); });
  return copy.textContent;
};
const article = document.querySelector('article');
const images = Array.from(document.images);
if (document.readyState !== 'complete' || images.some(i => !i.complete)) return null;
return {
  title: document.title,
  h1: article && article.querySelector('h1') ? article.querySelector('h1').innerText : '',
  text: article ? article.innerText : '',
  prose: prose(article),
  images: images.map(i => [i.getAttribute('src'), i.naturalWidth]),
};
"""


def nav_pages(nav: list[Any]) -> Iterator[tuple[str, str]]:
    """(title, page.md) of every page in mkdocs.yml's nav, sections flattened."""
    for entry in nav:
        for title, target in entry.items() if isinstance(entry, dict) else [(None, entry)]:
            if isinstance(target, list):
                yield from nav_pages(target)
            else:
                yield str(title), str(target)


def page_url(page: str) -> str:
    """The URL path mkdocs gives a page (use_directory_urls: guides/beat.md -> guides/beat/)."""
    stem = page.removesuffix(".md")
    if stem == "index":
        return ""
    return stem.removesuffix("/index") + "/"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built once with ``mkdocs build --strict`` and served over HTTP."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,  # mkdocs.yml's snippet paths are relative to the checkout
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # No name resolves but localhost: the site must render offline (Material's Google
    # font falls back to the system's), and a page never waits on the network.
    opened = Browser(extra_args=("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",))
    yield opened
    opened.close()


def test_every_page_in_the_nav_renders(site: str, browser: Browser) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    site_name = config["site_name"]
    pages = list(nav_pages(config["nav"]))
    assert len(pages) >= 20, pages  # the nav was read, not skipped
    problems: list[str] = []
    for title, page in pages:
        url = site + page_url(page)
        with urllib.request.urlopen(url, timeout=10) as reply:  # a missing page raises 404
            assert reply.status == 200, url
        browser.get(url)
        seen = browser.wait_for(PAGE, f"{page} and its images loaded")
        expected = site_name if page == "index.md" else f"{title} - {site_name}"
        if seen["title"] != expected:
            problems.append(f"{page}: title {seen['title']!r}, not {expected!r}")
        if not seen["h1"] or "404" in seen["h1"]:
            problems.append(f"{page}: heading {seen['h1']!r}")
        if len(seen["text"]) < 200:
            problems.append(f"{page}: {len(seen['text'])} characters of text")
        problems += [f"{page}: image {src} not shown" for src, width in seen["images"] if not width]
        problems += [
            f"{page}: raw role {m.group(0)!r} in {seen['prose'][m.start() - 40 : m.end() + 40]!r}"
            for m in RAW_ROLE.finditer(seen["prose"])
        ]
    assert not problems, "\n".join(problems)


def test_the_benchmarks_page_shows_its_figures(site: str, browser: Browser) -> None:
    """The images check above must have images to check: the benchmarks page's figures."""
    browser.get(site + "benchmarks/")
    seen = browser.wait_for(PAGE, "the benchmarks page and its images loaded")
    shown = [src for src, width in seen["images"] if width > 0 and src.endswith(".png")]
    assert len(shown) >= 3, seen["images"]
