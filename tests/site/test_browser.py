"""course.book.browser: the flags the browser checks run Chromium with, and what counts as a
request that left the machine.

Real Chromium on a page served from a temporary folder: with :data:`OFFLINE_ARGS`, a
script from a CDN, a font stylesheet and a ``fetch`` to other hosts all fail unresolved,
and a listener on the context records each one, which :func:`leaves_the_machine` names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from site_helpers import serve_directory

from course.book.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LOCAL_HOST,
    OFFLINE_ARGS,
    leaves_the_machine,
)

pytestmark = pytest.mark.site

ELSEWHERE = ("https://cdn.jsdelivr.net/npm/x.js", "https://fonts.googleapis.com/css?family=A",
             "https://example.org/a")
PAGE = f"""<html><head><script src="{ELSEWHERE[0]}"></script>
<link rel="stylesheet" href="{ELSEWHERE[1]}"></head>
<body><h1>x</h1><script>fetch("{ELSEWHERE[2]}").catch(() => {{}})</script></body></html>"""


@pytest.mark.parametrize(
    ("url", "leaves"),
    [
        (f"http://{LOCAL_HOST}:8000/book/intro.html", False),
        (f"ws://{LOCAL_HOST}:9999/api/kernels", False),
        ("data:image/png;base64,AAAA", False),
        ("blob:http://127.0.0.1:8000/1234", False),
        ("about:blank", False),
        ("https://cdn.jsdelivr.net/pyodide/v0.29/full/pyodide.js", True),
        ("http://localhost:8000/index.html", True),  # resolves nowhere under OFFLINE_ARGS
        ("wss://example.org/socket", True),
    ],
)
def test_leaves_the_machine(url: str, leaves: bool) -> None:
    assert leaves_the_machine(url) is leaves


def test_other_hosts_fail_unresolved_and_are_recorded(tmp_path: Path) -> None:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (Debian's chromium)")
    from playwright.sync_api import sync_playwright

    (tmp_path / "index.html").write_text(PAGE, encoding="utf-8")
    requested: list[str] = []
    failed: dict[str, str] = {}
    with serve_directory(tmp_path) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *OFFLINE_ARGS], headless=True)
        try:
            context = browser.new_context()
            context.on("request", lambda request: requested.append(request.url))
            context.on("requestfailed", lambda request: failed.update(
                {request.url: request.failure or ""}))
            page = context.new_page()
            page.goto(f"{base}index.html", wait_until="load")
            for _ in range(200):  # the fetch may fail after the page's load: up to 10 s
                if len(failed) >= len(ELSEWHERE):
                    break
                page.wait_for_timeout(50)
        finally:
            browser.close()
    assert sorted(u for u in requested if leaves_the_machine(u)) == sorted(ELSEWHERE), requested
    assert {u: failed.get(u) for u in ELSEWHERE} == dict.fromkeys(
        ELSEWHERE, "net::ERR_NAME_NOT_RESOLVED"), failed
    assert f"{base}index.html" in requested and f"{base}index.html" not in failed
