"""The built site as a screen reader, a keyboard and a zoomed browser meet it.

- axe-core (the npm package pinned in package.json), every rule it runs by default, on
  every page of the site: each page of _toc.yml (the calculator once it shows a result,
  its plot included) and the JupyterLite landing page (``lite/``: the exercises' file
  browser, once its loading view has gone and the student id has been given): no
  critical or serious violation. The pages are the site's tour's (tests/site_tour.py):
  one Chromium, a few pages at once, each loaded once for every browser check.
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

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from site_helpers import contrast_ratio, ensure_site, toc_pages
from site_tour import CALCULATOR, LITE, NARROW

pytestmark = pytest.mark.site

PAGES = [p.docname for p in toc_pages()]
AXE_PAGES = [*PAGES, LITE]
SERIOUS = ("critical", "serious")


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
def site_run(site_tour: dict[str, Any]) -> SiteRun:
    """Every page as the site's tour saw it (tests/site_tour.py): axe-core on each, the
    calculator's plot colours, the calculator and lite pages at 320 px."""
    pages = site_tour["pages"]
    return SiteRun(
        axe={docname: seen["axe"] for docname, seen in pages.items()},
        reflow=site_tour["reflow"],
        plot_colours=site_tour["plot_colours"],
        remote=site_tour["remote"],
        errors=[f"{docname}: {error}" for docname, seen in pages.items()
                for error in seen["errors"]],
    )


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
