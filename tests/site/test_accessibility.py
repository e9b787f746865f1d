"""The built site as a screen reader, a keyboard and a zoomed browser meet it.

- axe-core (the npm package pinned in package.json), every rule it runs by default, on
  every page of the site: each page of _toc.yml (the calculator once it shows a result,
  its plot included) and the JupyterLite landing page (``lite/``: the exercises' file
  browser, once its loading view has gone and the student id has been given): no
  critical or serious violation. One Chromium, a few pages at once.
- Reflow at 320 CSS px (a 1280 px window at 400% zoom), for the pages test_reading.py
  does not narrow (it covers the chapter pages): the calculator with its result and
  plot, and the JupyterLite landing page: no sideways page scroll, and the content keeps
  its width (the article, or JupyterLab's main area, is not squeezed out of view).
- Colours: the calculator's plot, drawn in the page, meets WCAG 2.1 AA contrast on the
  page's background (text 4.5:1, the marks that carry data 3:1), computed with WCAG's
  relative-luminance formula from the colours the browser resolved.
- Figures: every image of the built pages has alt text that says what it shows: not
  empty, not a file name or an address (docutils writes the image's path when a figure
  names no alt text), a few words at least.

The calculator from the keyboard alone is tests/site/test_calculator.py's.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from site_helpers import (
    ROOT,
    SETTLE_BODY,
    contrast_ratio,
    ensure_site,
    serve_directory,
    toc_pages,
    visit_in_tabs,
)

from course.book.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.site

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # npm ci (make book) installs it
CALCULATOR = "book/calculator"
LITE = "lite"  # the JupyterLite landing page: lite/ forwards to lite/lab/
PAGES = [p.docname for p in toc_pages()]
AXE_PAGES = [*PAGES, LITE]
CONCURRENT_PAGES = 3
WAIT_MS = 300_000  # Pyodide's or JupyterLite's first start on a busy 2-core machine
WIDE = 1280  # CSS px: the desktop window every page is checked in first
NARROW = 320  # CSS px: 1280 px at 400% zoom (WCAG 1.4.10)
SERIOUS = ("critical", "serious")

# After load: MathJax typeset and fonts loaded.
SETTLE_JS = f"async () => {{{SETTLE_BODY}}}"
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


@dataclass
class SiteRun:
    """What the browser found on each page."""

    axe: dict[str, dict[str, Any]] = field(default_factory=dict)
    reflow: dict[str, dict[str, Any]] = field(default_factory=dict)
    plot_colours: dict[str, Any] = field(default_factory=dict)
    remote: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def built_site() -> Path:
    return ensure_site()


@pytest.fixture(scope="module")
def site_run(built_site: Path) -> Iterator[SiteRun]:
    """Every page once in one Chromium: axe-core, then (calculator, lite) at 320 px."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (Debian's chromium)")
    assert AXE.is_file(), f"{AXE} is missing: run `make book` (npm ci installs axe-core)"
    with serve_directory(built_site) as base_url:
        run = SiteRun()
        asyncio.run(_visit_all(base_url, run))
        yield run


async def _visit_all(base_url: str, run: SiteRun) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )

        async def guard(route: Any) -> None:
            """Nothing leaves the machine: other hosts are refused and recorded."""
            if route.request.url.startswith((base_url, "data:", "blob:", "about:")):
                await route.continue_()
            else:
                run.remote.append(route.request.url)
                await route.abort()

        async def visit(page: Any, docname: str) -> None:
            await _visit(page, base_url, docname, run)

        try:
            context = await browser.new_context(viewport={"width": WIDE, "height": 900})
            await context.route("**/*", guard)
            await visit_in_tabs(context, PAGES, visit, CONCURRENT_PAGES)
            # JupyterLite's landing page in a tab of its own: it installs a service worker.
            lite = await context.new_page()
            try:
                await _visit(lite, base_url, LITE, run)
            finally:
                await lite.close()
            await context.close()
        finally:
            await browser.close()


async def _visit(page: Any, base_url: str, docname: str, run: SiteRun) -> None:
    """axe on one page once it has settled; the calculator's plot colours, and the
    calculator and lite pages at 320 px (the tab is put back to its width after)."""

    def on_error(exc: Any) -> None:
        run.errors.append(f"{docname}: {exc}")

    page.on("pageerror", on_error)
    try:
        if docname == LITE:
            await _open_lite(page, base_url)
        else:
            await page.goto(f"{base_url}{docname}.html", wait_until="load")
            await page.evaluate(SETTLE_JS)
        if docname == CALCULATOR:
            await page.wait_for_function(
                f"() => {CALCULATOR_STATE}.state === 'ready' && {CALCULATOR_STATE}.plot"
                " === 'done'", timeout=WAIT_MS)
            run.plot_colours = await page.evaluate(PLOT_COLOURS_JS)
        await page.add_script_tag(path=str(AXE))
        run.axe[docname] = await page.evaluate(AXE_RUN)
        if docname in (CALCULATOR, LITE):
            await page.set_viewport_size({"width": NARROW, "height": 900})
            await page.wait_for_timeout(500)  # let the layout settle
            content = "#jp-main-dock-panel" if docname == LITE else "article.bd-article"
            run.reflow[docname] = await page.evaluate(REFLOW_JS, content)
            await page.set_viewport_size({"width": WIDE, "height": 900})
    finally:
        page.remove_listener("pageerror", on_error)


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


@pytest.mark.parametrize("docname", AXE_PAGES)
def test_axe_finds_no_serious_violation(site_run: SiteRun, docname: str) -> None:
    found = site_run.axe[docname]
    serious = [v for v in found["violations"] if v[0] in SERIOUS]
    assert serious == [], serious
    assert found["passed"] > 10  # axe ran on the page


def test_every_page_was_checked_offline(site_run: SiteRun) -> None:
    assert sorted(site_run.axe) == sorted(AXE_PAGES)
    assert site_run.remote == [], site_run.remote
    assert site_run.errors == [], site_run.errors


@pytest.mark.parametrize("docname", [CALCULATOR, LITE])
def test_reflows_at_320_px(site_run: SiteRun, docname: str) -> None:
    seen = site_run.reflow[docname]
    assert seen["clientWidth"] == NARROW
    assert seen["scrollWidth"] <= seen["clientWidth"] + 1, (
        f"the page is {seen['scrollWidth']} px wide in a {NARROW} px window; "
        f"sticking out: {seen['wide']}"
    )
    assert seen["wide"] == [], seen["wide"]
    # The content keeps the width (JupyterLab's side tab bars, 33 px each, stay beside it).
    assert seen["contentWidth"] >= NARROW * 0.75, seen


def parse_colour(css: str) -> tuple[float, float, float]:
    """An opaque colour as the browser writes a computed one, rgb(r, g, b) or #rrggbb,
    as sRGB channels 0-1."""
    if css.startswith("#") and len(css) == 7:
        return (int(css[1:3], 16) / 255, int(css[3:5], 16) / 255, int(css[5:7], 16) / 255)
    found = re.fullmatch(r"rgba?\((\d+(?:\.\d+)?), (\d+(?:\.\d+)?), (\d+(?:\.\d+)?)(, 1)?\)", css)
    assert found, f"not an opaque colour: {css}"
    return (float(found[1]) / 255, float(found[2]) / 255, float(found[3]) / 255)


def test_contrast_formula_matches_wcag() -> None:
    """Black on white is 21:1, a colour on itself 1:1, and #767676 on white the lightest
    grey that passes 4.5:1 (4.54:1)."""
    white, black = parse_colour("#ffffff"), parse_colour("rgb(0, 0, 0)")
    assert contrast_ratio(black, white) == pytest.approx(21)
    assert contrast_ratio(white, white) == pytest.approx(1)
    assert contrast_ratio(parse_colour("#767676"), white) == pytest.approx(4.54, abs=0.01)
    assert contrast_ratio(parse_colour("#777777"), white) < 4.5


def test_calculator_plot_colours_meet_wcag_aa(site_run: SiteRun) -> None:
    colours = site_run.plot_colours
    background = parse_colour(colours["background"])
    assert colours["text"] and colours["marks"], colours
    low = [(name, css, round(contrast_ratio(parse_colour(css), background), 2))
           for kind, limit in (("text", 4.5), ("marks", 3.0))
           for name, css in colours[kind]
           if contrast_ratio(parse_colour(css), background) < limit]
    assert low == [], f"below AA on {colours['background']}: {low}"


class _Images(HTMLParser):
    """The alt text and address of every <img> of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str | None, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            found = dict(attrs)
            self.images.append((found.get("alt"), found.get("src") or ""))


FILE_NAME = re.compile(r"\.(png|jpe?g|gif|svg|webp|pdf)\b|^\S*/\S*$|^[\w.-]+$", re.IGNORECASE)


def alt_problem(alt: str | None, src: str) -> str | None:
    """Why ``alt`` does not say what the image shows, or None."""
    if alt is None or not alt.strip():
        return "no alt text"
    stem = Path(src.split("?")[0]).stem
    if FILE_NAME.search(alt.strip()) or stem and stem in alt:
        return f"alt text is a file name: {alt!r}"
    if len(alt.split()) < 3:
        return f"alt text too short to say what it shows: {alt!r}"
    return None


def test_alt_check_catches_file_names() -> None:
    assert alt_problem(None, "a.png") == "no alt text"
    assert alt_problem(" ", "a.png") == "no alt text"
    assert alt_problem("../../_images/7205e7d0.png", "../../_images/7205e7d0.png")
    assert alt_problem("7205e7d0", "../../_images/7205e7d0.png")
    assert alt_problem("figure", "x.png")
    assert alt_problem("Seats against context for two models, falling as context grows",
                       "../../_images/7205e7d0.png") is None


@pytest.mark.parametrize("docname", PAGES)
def test_every_figure_says_what_it_shows(built_site: Path, docname: str) -> None:
    parser = _Images()
    parser.feed((built_site / f"{docname}.html").read_text(encoding="utf-8"))
    problems = [f"{src}: {problem}" for alt, src in parser.images
                if (problem := alt_problem(alt, src))]
    assert problems == [], problems
