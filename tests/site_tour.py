"""One tour of the built site in headless Chromium, shared by the site's browser checks.

tests/site/test_site.py (what a page renders), test_reading.py (no sideways scroll at
three widths) and test_accessibility.py (axe-core, reflow, the plot's colours) each read
what the browser saw on a page. Loading and typesetting a page is most of what a check
costs, so every page is loaded once per test run and each step the three modules need is
done on it, in this order, in a 1280 px window:

1. the page report (title, headings, math typeset, images, links), once MathJax, the
   fonts and the network have settled;
2. a full-page screenshot (chapter 1's pages, into artifacts/);
3. how far the page reaches past the window's right edge at 1280, 390 and 320 px (chapter
   pages), then the window is put back to 1280 px;
4. axe-core with every rule it runs by default (the calculator once it shows its result
   and plot, whose colours are read first);
5. the calculator's reflow at 320 px.

JupyterLite's landing page is toured last, in a tab of its own (it installs a service
worker): the student id given, axe-core, then its reflow at 320 px.

The tour runs in whichever test process asks first. The others (pytest-xdist workers of
the same run, which share ``PYTEST_XDIST_TESTRUNUID``) wait on a lock and read its record
from ``_build/tour/RUN.json``. Kept free of pytest, like site_helpers.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from site_helpers import BUILD_DIR, ROOT, SETTLE_BODY, serve_directory, toc_pages, visit_in_tabs

from course.book.browser import CHROMIUM, CHROMIUM_ARGS, OFFLINE_ARGS, leaves_the_machine

sys.path.insert(0, str(ROOT / "scripts"))

from measure_pages import chapter_docnames  # noqa: E402

ARTIFACTS = ROOT / "artifacts"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # npm ci (make book) installs it
TOUR_DIR = BUILD_DIR / "tour"
CHAPTER_1 = "book/01_kv_cache/"
CALCULATOR = "book/calculator"
LITE = "lite"  # the JupyterLite landing page: lite/ forwards to lite/lab/
WIDE = 1280  # CSS px: the desktop window every page is checked in first
WIDTHS = (WIDE, 390, 320)  # 320: a 1280 px window at 400% zoom (WCAG 1.4.10)
NARROW = WIDTHS[-1]
HEIGHT = 900
CHAPTER_PAGES = frozenset(chapter_docnames((ROOT / "_toc.yml").read_text(encoding="utf-8")))
TABS = 4  # a visit mostly waits (MathJax, fonts, the network falling quiet)
WAIT_MS = 300_000  # Pyodide's or JupyterLite's first start on a busy 2-core machine

# After load: waits for MathJax, the fonts, then no new resource for 300 ms (at most 10 s,
# "network idle" measured in the page); reports what a reader would see.
PAGE_REPORT_JS = """
async () => {
  const mathNodes = Array.from(document.querySelectorAll('.math'));
  let mathjaxError = null;
  if (mathNodes.length > 0) {
    const deadline = Date.now() + 20000;
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      if (Date.now() > deadline) { mathjaxError = 'MathJax never started'; break; }
      await new Promise(r => setTimeout(r, 50));
    }
    if (!mathjaxError) { await MathJax.startup.promise; }
  }
  await document.fonts.ready;
  let seen = -1, quietSince = Date.now();
  const settle = Date.now() + 10000;
  while (Date.now() < settle) {
    const fetched = performance.getEntriesByType('resource').length;
    if (fetched !== seen) { seen = fetched; quietSince = Date.now(); }
    else if (Date.now() - quietSince >= 300) { break; }
    await new Promise(r => setTimeout(r, 50));
  }
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  let prose = '';
  if (article) {
    const clone = article.cloneNode(true);
    clone.querySelectorAll('pre, code, mjx-container, script, style, .highlight')
      .forEach(e => e.remove());
    prose = clone.textContent;
  }
  const h1 = article ? article.querySelector('h1') : null;
  return {
    title: document.title,
    h1: h1 ? h1.textContent.trim() : '',
    articleTextLength: article ? article.textContent.trim().length : 0,
    prose: prose,
    mathNodes: mathNodes.length,
    untypesetMath: mathNodes.filter(n => !n.querySelector('mjx-container')).length,
    mjxContainers: document.querySelectorAll('mjx-container').length,
    mjxErrors: Array.from(document.querySelectorAll('mjx-merror, [data-mjx-error]'))
      .map(e => e.getAttribute('data-mjx-error') || e.textContent),
    mathjaxError: mathjaxError,
    mathjaxScripts: Array.from(document.querySelectorAll('script[src*="mathjax"]'))
      .map(s => s.src),
    images: Array.from(document.images).map(i => ({
      src: i.currentSrc || i.src, complete: i.complete, naturalWidth: i.naturalWidth,
      inArticle: article ? article.contains(i) : false})),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  };
}
"""

# Once settled, how far the page reaches past the window's right edge, and the elements
# of the article that stick out (outside any box that scrolls on its own).
OVERFLOW_JS = """
async () => {""" + SETTLE_BODY + """
  const root = document.documentElement;
  const width = root.clientWidth;
  const scrolls = e => {
    for (let p = e.parentElement; p; p = p.parentElement) {
      const s = getComputedStyle(p).overflowX;
      if ((s === 'auto' || s === 'scroll' || s === 'hidden') && p !== document.body
          && p !== root) { return true; }
    }
    return false;
  };
  const wide = Array.from(document.querySelectorAll('article *'))
    .filter(e => e.getBoundingClientRect().right > width + 1 && !scrolls(e))
    .slice(0, 5)
    .map(e => e.tagName.toLowerCase() + (e.className ? '.' + String(e.className)
      .split(' ')[0] : ''));
  return {scrollWidth: root.scrollWidth, clientWidth: width, wide: wide};
}
"""

# Every violation as [impact, rule id, elements, the first element's selector]; and how
# many rules passed (axe ran on the page).
AXE_RUN = """async () => {
  const found = await axe.run(document);
  return {
    violations: found.violations.map(v => [v.impact, v.id, v.nodes.length,
                                            String(v.nodes[0].target)]),
    passed: found.passes.length,
  };
}"""

CALCULATOR_STATE = "document.getElementById('kv-calculator').dataset"
CALCULATOR_DONE = (f"() => {CALCULATOR_STATE}.state === 'ready' && {CALCULATOR_STATE}.plot"
                   " === 'done'")

# How wide the page is against its window, how wide its content is, and the elements that
# stick out of the window (outside any box that scrolls on its own).
REFLOW_JS = """(content) => {
  const root = document.documentElement;
  const width = root.clientWidth;
  const scrolls = e => {
    for (let p = e.parentElement; p && p !== document.body && p !== root; p = p.parentElement) {
      const s = getComputedStyle(p).overflowX;
      if (s === 'auto' || s === 'scroll') { return true; }
    }
    return false;
  };
  const box = document.querySelector(content);
  const shown = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const wide = Array.from((box || document.body).querySelectorAll('*'))
    .filter(e => shown(e) && e.getBoundingClientRect().right > width + 1 && !scrolls(e))
    .slice(0, 5)
    .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : ''));
  return {scrollWidth: root.scrollWidth, clientWidth: width, wide: wide,
          contentWidth: box ? box.getBoundingClientRect().width : 0};
}"""

# The colours of the calculator's plot as the browser resolved them, with the page's
# background: {"text": [[class, colour]...], "marks": [[class, colour]...], "background"}.
PLOT_COLOURS_JS = """() => {
  const plot = document.querySelector('#kv-plot svg');
  const style = e => getComputedStyle(e);
  const name = e => e.tagName + '.' + (e.getAttribute('class') || '');
  const text = Array.from(plot.querySelectorAll('text')).map(e => [name(e), style(e).fill]);
  const marks = [];
  for (const e of plot.querySelectorAll('.kv-line')) marks.push([name(e), style(e).stroke]);
  for (const e of plot.querySelectorAll('circle')) {
    const s = style(e);
    marks.push([name(e), s.fill !== 'none' ? s.fill : s.stroke]);
  }
  let bg = 'rgba(0, 0, 0, 0)';
  for (let e = plot; e && /rgba\\(.*, 0\\)|transparent/.test(bg); e = e.parentElement) {
    bg = style(e).backgroundColor;
  }
  if (/rgba\\(.*, 0\\)|transparent/.test(bg)) bg = 'rgb(255, 255, 255)';
  return {text: text, marks: marks, background: bg};
}"""


def run_id() -> str:
    """The test run this process belongs to: pytest-xdist gives its workers one id; a
    process on its own gets an id of its own."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or _own_run_id()


@functools.cache
def _own_run_id() -> str:
    return f"pid{os.getpid()}-{uuid.uuid4().hex}"


def shared_tour(html_dir: Path) -> dict[str, Any]:
    """The tour's record for this test run: read from the file a process of the run wrote,
    or made now (holding the lock, so that the run tours the site once)."""
    TOUR_DIR.mkdir(parents=True, exist_ok=True)
    record = TOUR_DIR / f"{run_id()}.json"
    with open(TOUR_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.is_file():
            return dict(json.loads(record.read_text(encoding="utf-8")))
        found = tour(html_dir)
        for old in TOUR_DIR.glob("*.json"):  # earlier runs' records
            old.unlink()
        record.write_text(json.dumps(found), encoding="utf-8")
        return found


def tour(html_dir: Path) -> dict[str, Any]:
    """Serve ``html_dir`` on 127.0.0.1 and tour it in one Chromium (see the module's
    docstring). The record, JSON-ready:

    ``base_url``; ``pages``: docname to {``status``, ``report``, ``errors`` (JavaScript
    errors), ``overflow`` (width to what OVERFLOW_JS found), ``axe``}; ``plot_colours``,
    ``reflow`` (docname to what REFLOW_JS found at 320 px); ``screenshots`` (paths);
    ``remote`` (requests to other hosts, which fail unresolved); for the book's pages,
    ``failed`` (failed requests), ``bad_responses`` (status 400 and up) and ``fonts`` ([address,
    status] of each font fetched).
    """
    if not CHROMIUM.is_file():
        raise AssertionError(
            f"{CHROMIUM} is missing: the site tests need Debian's Chromium. Run `make "
            "browser` (apt-get install chromium); a browser is never downloaded.")
    if not AXE.is_file():
        raise AssertionError(f"{AXE} is missing: run `make book` (npm ci installs axe-core)")
    ARTIFACTS.mkdir(exist_ok=True)
    # axe-core is loaded by its address, from a server of its own on the same host, not
    # injected as text: Chromium then keeps its compiled code from one page to the next
    # (as text, every page compiled its half megabyte again: 20 CPU s over the tour).
    with serve_directory(html_dir) as base_url, serve_directory(AXE.parent) as axe_base:
        found: dict[str, Any] = {
            "base_url": base_url, "pages": {}, "plot_colours": {}, "reflow": {},
            "screenshots": [], "remote": [], "failed": [], "bad_responses": [], "fonts": [],
        }
        asyncio.run(_tour(base_url, f"{axe_base}{AXE.name}", found))
    found["screenshots"].sort()
    return found


async def _tour(base_url: str, axe_url: str, found: dict[str, Any]) -> None:
    from playwright.async_api import async_playwright

    # Nothing leaves the machine: the browser resolves no other host (OFFLINE_ARGS), and
    # every request for one is recorded. Not Playwright's request routing, which turns
    # the HTTP cache off: each page would fetch and compile every script again (MathJax,
    # the theme's), about 30 CPU seconds over the site.
    def note_remote(request: Any) -> None:
        if leaves_the_machine(request.url):
            found["remote"].append(request.url)

    def on_failed(request: Any) -> None:
        found["failed"].append(f"{request.url}: {request.failure}")

    def on_response(response: Any) -> None:
        if _tab_of(response.request) in axe_tabs:
            return
        if response.status >= 400:
            found["bad_responses"].append(f"{response.status} {response.url}")
        if response.url.endswith(".woff"):
            found["fonts"].append([response.url, response.status])

    # axe-core fetches a page's stylesheets again to read their rules, and resolves their
    # relative @imports against the page, not the stylesheet (theme.css's "../basic.css"
    # becomes book/basic.css, a 404): what the browser itself fetched is what is checked.
    axe_tabs: set[Any] = set()

    async def visit(page: Any, docname: str) -> None:
        found["pages"][docname] = await _visit(page, base_url, axe_url, docname, found,
                                               axe_tabs)

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *OFFLINE_ARGS],
            headless=True)
        try:
            context = await browser.new_context(viewport={"width": WIDE, "height": HEIGHT})
            context.on("request", note_remote)
            context.on("requestfailed", on_failed)
            context.on("response", on_response)
            await visit_in_tabs(context, [p.docname for p in toc_pages()], visit, TABS)
            # The book's pages only: JupyterLite asks for files a static site may not have.
            context.remove_listener("requestfailed", on_failed)
            context.remove_listener("response", on_response)
            lite = await context.new_page()
            try:
                await visit(lite, LITE)
            finally:
                await lite.close()
            await context.close()
        finally:
            await browser.close()


def _tab_of(request: Any) -> Any:
    """The tab a request came from; None for a service worker's."""
    from playwright.async_api import Error

    try:
        return request.frame.page
    except Error:  # "Service Worker requests do not have an associated frame"
        return None


async def _visit(page: Any, base_url: str, axe_url: str, docname: str, found: dict[str, Any],
                 axe_tabs: set[Any]) -> dict[str, Any]:
    """Every step of the tour on one page (the module's docstring lists them); the tab is
    back at 1280 px when it returns. While axe-core runs, the tab is in ``axe_tabs``."""
    seen: dict[str, Any] = {"errors": [], "overflow": {}}

    def on_error(exc: Any) -> None:
        seen["errors"].append(str(exc))

    page.on("pageerror", on_error)
    try:
        if docname == LITE:
            seen["status"] = None
            await _open_lite(page, base_url)
        else:
            response = await page.goto(f"{base_url}{docname}.html", wait_until="load")
            seen["status"] = response.status if response else None
            seen["report"] = await page.evaluate(PAGE_REPORT_JS)
        if docname.startswith(CHAPTER_1):
            shot = ARTIFACTS / f"{docname.replace('/', '_')}.png"
            await page.screenshot(path=str(shot), full_page=True)
            found["screenshots"].append(str(shot))
        if docname == CALCULATOR:
            await page.wait_for_function(CALCULATOR_DONE, timeout=WAIT_MS)
            found["plot_colours"] = await page.evaluate(PLOT_COLOURS_JS)
        if docname in CHAPTER_PAGES:
            seen["overflow"][str(WIDE)] = await page.evaluate(OVERFLOW_JS)
        axe_tabs.add(page)
        await page.add_script_tag(url=axe_url)
        seen["axe"] = await page.evaluate(AXE_RUN)
        await _narrowed(page, docname, seen, found)
    finally:
        axe_tabs.discard(page)
        page.remove_listener("pageerror", on_error)
    return seen


async def _narrowed(page: Any, docname: str, seen: dict[str, Any], found: dict[str, Any]) -> None:
    """A chapter page's overflow at the narrower widths; the calculator's and JupyterLite's
    reflow at 320 px. The window goes back to 1280 px after."""
    chapter = bool(seen["overflow"])
    if not chapter and docname not in (CALCULATOR, LITE):
        return
    for width in WIDTHS[1:]:
        if not chapter and width != NARROW:
            continue
        await page.set_viewport_size({"width": width, "height": HEIGHT})
        if chapter:
            await page.wait_for_timeout(100)  # let the layout settle
            seen["overflow"][str(width)] = await page.evaluate(OVERFLOW_JS)
        else:
            await page.wait_for_timeout(500)  # JupyterLab lays out again on resize
            content = "#jp-main-dock-panel" if docname == LITE else "article.bd-article"
            found["reflow"][docname] = await page.evaluate(REFLOW_JS, content)
    await page.set_viewport_size({"width": WIDE, "height": HEIGHT})


async def _open_lite(page: Any, base_url: str) -> None:
    """The landing page as a learner first sees it: the student id given (typed, then
    Enter), JupyterLab restored and the loading view gone."""
    await page.goto(f"{base_url}{LITE}/", wait_until="commit")
    await page.wait_for_function("() => window.jupyterapp && window.jupyterapp.restored",
                                 timeout=WAIT_MS)
    await page.locator("#kvlib-id-dialog[open]").wait_for(timeout=WAIT_MS)
    await page.keyboard.type("a11y-check")
    await page.keyboard.press("Enter")
    await page.locator("#kvlib-id-dialog[open]").wait_for(state="detached", timeout=WAIT_MS)
    await page.wait_for_function("() => !document.getElementById('kvlib-loading')",
                                 timeout=WAIT_MS)
