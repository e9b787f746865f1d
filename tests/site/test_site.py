"""The built site, checked in headless Chromium (Debian's /usr/bin/chromium).

The site is built with scripts/build_book.py when _build/html is missing or older than
its sources, served on 127.0.0.1, and every page of _toc.yml is loaded once, by the tour
the site's browser checks share (tests/site_tour.py). The checks then read what the
browser saw: rendered pages, typeset math, loaded images, internal links that resolve,
and not a single request to another host.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urlsplit

import pytest
from site_helpers import (
    HTML_DIR,
    ROOT,
    TocPage,
    ensure_site,
    html_ids,
    source_has_math,
    source_has_plot,
    toc_pages,
)
from site_tour import LITE

pytestmark = pytest.mark.site

CHAPTER_1 = "book/01_kv_cache/"
MATHJAX_SCRIPT = "_static/mathjax/tex-mml-chtml.js"
CDN_HOSTS = re.compile(
    r"cdn\.jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com|fonts\.googleapis\.com"
    r"|fonts\.gstatic\.com|mathjax\.org|polyfill\.io|code\.jquery\.com|cdn\.plot\.ly"
)
# TeX left in the visible text means MathJax did not run (or the source was not parsed).
RAW_TEX = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\\frac\{|\$[^\s$][^$\n]*\$")


@pytest.fixture(scope="module")
def built_site() -> Path:
    """_build/html, rebuilt first when it is missing or older than its sources."""
    return ensure_site()


@dataclass
class Visit:
    """What the browser saw on one page."""

    status: int | None
    report: dict[str, Any]
    page_errors: list[str]


@dataclass
class BrowserRun:
    base_url: str
    visits: dict[str, Visit]
    remote_requests: list[str]
    failed_requests: list[str]
    bad_responses: list[str]
    font_responses: list[tuple[str, int]]
    screenshots: list[Path]


@pytest.fixture(scope="module")
def browser_run(site_tour: dict[str, Any]) -> BrowserRun:
    """Every toc page as the site's tour loaded it (tests/site_tour.py), with what the
    browser fetched while it did."""
    visits = {docname: Visit(seen["status"], seen["report"], seen["errors"])
              for docname, seen in site_tour["pages"].items() if docname != LITE}
    return BrowserRun(site_tour["base_url"], visits, site_tour["remote"], site_tour["failed"],
                      site_tour["bad_responses"],
                      [(url, status) for url, status in site_tour["fonts"]],
                      [Path(shot) for shot in site_tour["screenshots"]])


PAGES = toc_pages()
PAGE_IDS = [p.docname for p in PAGES]


def test_toc_lists_the_introduction_notation_and_chapter_1() -> None:
    docnames = [p.docname for p in PAGES]
    assert docnames[0] == "book/intro"
    assert "book/notation" in docnames
    assert f"{CHAPTER_1}overview" in docnames
    assert sum(d.startswith(CHAPTER_1) for d in docnames) >= 5
    missing = [str(p.source) for p in PAGES if not p.source.is_file()]
    assert not missing, f"pages named in _toc.yml without a source file: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_page_renders(browser_run: BrowserRun, page: TocPage) -> None:
    visit = browser_run.visits[page.docname]
    report = visit.report
    assert visit.status == 200
    assert report["title"].strip(), "empty <title>"
    assert report["h1"], "no <h1> in the article"
    assert report["h1"].rstrip("#").strip() in report["title"]
    assert report["articleTextLength"] > 300, "the article is (nearly) empty"
    assert not visit.page_errors, f"JavaScript errors: {visit.page_errors}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_math_is_typeset(browser_run: BrowserRun, page: TocPage) -> None:
    report = browser_run.visits[page.docname].report
    if source_has_math(page.source):
        assert report["mathNodes"] > 0, "the source has math but the page has no .math node"
        assert report["mjxContainers"] >= report["mathNodes"]
        assert any(
            urlsplit(s).path.endswith(MATHJAX_SCRIPT) and s.startswith(browser_run.base_url)
            for s in report["mathjaxScripts"]
        ), report["mathjaxScripts"]
    assert report["mathjaxError"] is None, report["mathjaxError"]
    assert report["untypesetMath"] == 0, f"{report['untypesetMath']} math nodes left as TeX"
    assert not report["mjxErrors"], f"TeX errors: {report['mjxErrors']}"
    raw = RAW_TEX.findall(report["prose"])
    assert not raw, f"raw TeX delimiters in the visible text: {raw[:5]}"


def test_mathjax_fonts_load_locally(browser_run: BrowserRun) -> None:
    assert browser_run.font_responses, "no MathJax font was requested"
    for url, status in browser_run.font_responses:
        assert url.startswith(browser_run.base_url + "_static/mathjax/"), url
        # 304: the copy in the browser's cache revalidated (a page after the first one).
        assert status in (200, 304), (status, url)
    assert any(status == 200 for _, status in browser_run.font_responses)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_images_load(browser_run: BrowserRun, page: TocPage) -> None:
    images = browser_run.visits[page.docname].report["images"]
    broken = [i["src"] for i in images if not (i["complete"] and i["naturalWidth"] > 0)]
    assert not broken, f"images that did not load: {broken}"
    if source_has_plot(page.source):
        assert any(i["inArticle"] for i in images), "the page draws a plot but shows no image"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_internal_links_resolve(browser_run: BrowserRun, page: TocPage) -> None:
    base = browser_run.base_url
    problems = []
    for href in browser_run.visits[page.docname].report["links"]:
        if not href.startswith(base):
            assert urlsplit(href).scheme in {"http", "https", "mailto"}, href
            continue
        url, fragment = urldefrag(href)
        target = HTML_DIR / unquote(urlsplit(url).path).lstrip("/")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"{href}: no file {target.relative_to(HTML_DIR)}")
        elif fragment and target.suffix == ".html" and unquote(fragment) not in html_ids(target):
            problems.append(f"{href}: no id {fragment!r} in {target.relative_to(HTML_DIR)}")
    assert not problems, "broken internal links:\n" + "\n".join(problems)


def test_no_request_leaves_the_machine(browser_run: BrowserRun) -> None:
    assert len(browser_run.visits) == len(PAGES)
    assert not browser_run.remote_requests, f"remote requests: {browser_run.remote_requests}"
    local_failures = [f for f in browser_run.failed_requests if f.startswith(browser_run.base_url)]
    assert not local_failures, f"failed requests: {local_failures}"
    assert not browser_run.bad_responses, f"error responses: {browser_run.bad_responses}"


def test_chapter_1_screenshots_saved(browser_run: BrowserRun) -> None:
    assert browser_run.screenshots
    for shot in browser_run.screenshots:
        assert shot.stat().st_size > 10_000, f"{shot} looks blank"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_built_html_names_no_cdn(built_site: Path) -> None:
    """No page, and no theme asset outside the vendored MathJax, names a CDN host."""
    offenders = []
    mathjax_dir = built_site / "_static" / "mathjax"
    for path in built_site.rglob("*"):
        if path.suffix not in {".html", ".js", ".css"} or mathjax_dir in path.parents:
            continue
        for match in CDN_HOSTS.finditer(path.read_text(encoding="utf-8", errors="replace")):
            offenders.append(f"{path.relative_to(built_site)}: {match.group(0)}")
    assert not offenders, "CDN addresses in the built site:\n" + "\n".join(offenders[:20])
    assert (mathjax_dir / "tex-mml-chtml.js").is_file()
    assert list((mathjax_dir / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))


def test_every_sidebar_toggle_has_a_name(built_site: Path) -> None:
    """The theme's section toggles hold only an icon: the build names each after its
    chapter, so a screen reader has something to announce (axe-core's summary-name)."""
    unnamed, named = [], 0
    for path in built_site.rglob("*.html"):
        if path.relative_to(built_site).parts[0] == "lite":
            continue
        text = path.read_text(encoding="utf-8")
        icon_only = text.count('<summary><span class="toctree-toggle"')
        unnamed += [f"{path.relative_to(built_site)}"] * icon_only
        named += len(re.findall(r'<summary aria-label="[^"]+: show or hide its sections">',
                                text))
    assert unnamed == [] and named > 0, unnamed[:10]


# A tiny book built with the same script and configuration: a clean page must build;
# a failing cell, a broken cross-reference or a cell writing to stderr (a warning
# printed by library code) must make the script exit non-zero.
_PAGE_HEADER = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---

# A page

Some prose with $x^2$ math.

"""
_CASES = {
    "clean": ("```{code-cell} ipython3\nprint(6 * 7)\n```\n", 0, "built"),
    "failing-cell": ("```{code-cell} ipython3\n1 / 0\n```\n", 1, "CellExecutionError"),
    "broken-reference": (
        "See {doc}`a page that does not exist <nowhere>`.\n",
        1,
        "unknown document",
    ),
    "stderr-output": (
        "```{code-cell} ipython3\nimport sys\nprint('x', file=sys.stderr)\n```\n",
        1,
        "stderr was found",
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_build_script_fails_on_any_warning(tmp_path: Path, case: str) -> None:
    body, expected_rc, expected_text = _CASES[case]
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (tmp_path / "index.md").write_text(_PAGE_HEADER + body)
    # The paths _config.yml names for static and extra files, as the course has them.
    (tmp_path / "_vendor").symlink_to(ROOT / "_vendor", target_is_directory=True)
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "_root").symlink_to(ROOT / "book" / "_root", target_is_directory=True)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_book.py"), "--source", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    assert (result.returncode != 0) == bool(expected_rc), output[-3000:]
    assert expected_text in output, output[-3000:]
    # Kernels start with CurveZMQ keys: no transport warning per executed page.
    assert "without encryption" not in output, output[-3000:]
