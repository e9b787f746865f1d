"""Helpers for tests/site/test_site.py: the build, the table of contents, a local server.

Kept free of pytest so that each piece can be read on its own.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import re
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from measure_pages import toc_docnames  # noqa: E402

BUILD_DIR = ROOT / "_build"
HTML_DIR = BUILD_DIR / "html"
# Written by scripts/build_book.py after a successful build, and only then.
BUILD_STAMP = BUILD_DIR / ".kvlib_sources.sha256"
# Inputs of the build: a change to any of them makes _build/html stale.
BUILD_INPUTS = [
    "_config.yml",
    "_toc.yml",
    "book",
    "kvlib",
    "course",
    "exercises",
    "scripts/build_book.py",
    "scripts/gpu_check.py",
    "scripts/pack_kvlib.py",
    "scripts/build_lite.py",
    "scripts/pyodide_compile.py",
    "lite",
    "package.json",
    "package-lock.json",
]


@dataclass(frozen=True)
class TocPage:
    """One page of the table of contents: its source file and its built HTML."""

    docname: str  # e.g. "book/01_kv_cache/overview"
    source: Path
    html: Path

    @property
    def url_path(self) -> str:
        return f"{self.docname}.html"


def toc_pages() -> list[TocPage]:
    """Every page named in _toc.yml, root first, in reading order."""
    pages = []
    for docname in toc_docnames((ROOT / "_toc.yml").read_text(encoding="utf-8")):
        sources = [ROOT / f"{docname}{ext}" for ext in (".md", ".ipynb")]
        source = next((s for s in sources if s.is_file()), sources[0])
        pages.append(TocPage(docname, source, HTML_DIR / f"{docname}.html"))
    return pages


def newest_input_mtime() -> float:
    """Latest modification time among the files the site is built from."""
    newest = 0.0
    for name in BUILD_INPUTS:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            if "__pycache__" in file.parts or ".ipynb_checkpoints" in file.parts:
                continue
            newest = max(newest, file.stat().st_mtime)
    return newest


def site_is_current() -> bool:
    """True when _build/html was completed after the last change to any input."""
    return (
        BUILD_STAMP.is_file()
        and (HTML_DIR / "index.html").is_file()
        and BUILD_STAMP.stat().st_mtime >= newest_input_mtime()
    )


def ensure_site() -> Path:
    """_build/html, built first when missing or older than its sources.

    Test processes (pytest-xdist workers) take a lock, so the site is built once.
    """
    import fcntl

    BUILD_DIR.mkdir(exist_ok=True)
    with open(BUILD_DIR / ".site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not site_is_current():
            result = build_site()
            if result.returncode != 0:
                raise AssertionError(
                    "scripts/build_book.py failed:\n"
                    + result.stdout[-4000:]
                    + result.stderr[-4000:]
                )
    if not site_is_current():
        raise AssertionError("the build finished but _build/html is still not current")
    return HTML_DIR


def start_site_build() -> threading.Thread | None:
    """Start building the site, holding the build lock, if no other process holds it and
    the site is stale; the thread returned waits for the build and releases the lock.
    None when there is nothing to start.

    The build (minutes) then overlaps the tests that do not need it; ``ensure_site``
    waits on the lock and finds the site current, or builds it again and reports the
    failure. The build's own output goes to ``_build/site-build.log``.
    """
    import fcntl

    if site_is_current():
        return None
    BUILD_DIR.mkdir(exist_ok=True)
    lock = open(BUILD_DIR / ".site.lock", "w")  # noqa: SIM115 (closed by the thread)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    with open(BUILD_DIR / "site-build.log", "w") as log:
        # Started here, not in the thread: it keeps this process's priority even when the
        # caller lowers its own right after (``os.nice``), so the build goes first.
        build = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "build_book.py")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )

    def wait() -> None:
        with lock:
            build.wait()

    thread = threading.Thread(target=wait, name="site-build", daemon=True)
    thread.start()
    return thread


def build_site() -> subprocess.CompletedProcess[str]:
    """Run scripts/build_book.py with this interpreter; output is captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_book.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# Display math ($$...$$), inline math ($...$) and amsmath environments in MyST source.
_MATH = re.compile(r"\$\$.+?\$\$|\$[^\s$][^$\n]*\$|\\begin\{(align|equation)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_FENCE_LINE = re.compile(r"^(`{3,}|~{3,})\s*(\S*)")


def prose_lines(text: str) -> str:
    """MyST text without code: code cells and plain fenced blocks are dropped.

    Directive fences (```{math}, ```{admonition}) are kept, because they hold math
    and prose; a fence closes on a line of the same marker with no info string.
    """
    kept: list[str] = []
    stack: list[tuple[str, bool]] = []  # (marker, is_code) of the open fences
    for line in text.splitlines():
        match = _FENCE_LINE.match(line.strip())
        if match and stack and match.group(1) == stack[-1][0] and not match.group(2):
            stack.pop()
            continue
        if match and match.group(2) and not (stack and stack[-1][1]):
            info = match.group(2)
            stack.append((match.group(1), info == "{code-cell}" or not info.startswith("{")))
            continue
        if match and not match.group(2) and not stack:
            stack.append((match.group(1), True))
            continue
        if not any(is_code for _, is_code in stack):
            kept.append(line)
    return _INLINE_CODE.sub("", "\n".join(kept))


def source_has_math(source: Path) -> bool:
    """True when a page's Markdown holds math outside code (MathJax must typeset it)."""
    return bool(_MATH.search(prose_lines(source.read_text(encoding="utf-8"))))


# Pages whose figures are drawn only from committed measurements: each draws one figure
# per file matching the glob (GPU runs exist only once someone ran scripts/gpu_check.py).
PLOTS_FROM_DATA = {"book/06_timing/06_gpu_runs": "book/data/gpu_*.json"}


def source_has_plot(source: Path) -> bool:
    """True when a page's code draws a matplotlib figure (the page must show an image)."""
    docname = source.relative_to(ROOT).with_suffix("").as_posix()
    if docname in PLOTS_FROM_DATA:
        return any(ROOT.glob(PLOTS_FROM_DATA[docname]))
    return "plt." in source.read_text(encoding="utf-8")


_ID = re.compile(r"""\bid=["']([^"']+)["']""")


@functools.cache
def html_ids(path: Path) -> frozenset[str]:
    """Every element id in a built HTML file (anchor targets)."""
    return frozenset(_ID.findall(path.read_text(encoding="utf-8", errors="replace")))


# -- Browser and colour helpers the site's tests share -------------------------------

# The body of an async function that waits, after load, for MathJax to typeset (when the
# page has math) and for the fonts: what a reader sees once the page has settled.
SETTLE_BODY = """
  if (document.querySelector('.math')) {
    const deadline = Date.now() + 20000;
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)
           && Date.now() < deadline) {
      await new Promise(r => setTimeout(r, 50));
    }
    if (window.MathJax && MathJax.startup) { await MathJax.startup.promise; }
  }
  await document.fonts.ready;
"""


async def visit_in_tabs(
    context: Any,
    docnames: Iterable[str],
    visit: Callable[[Any, str], Awaitable[None]],
    tabs: int,
) -> None:
    """``await visit(page, docname)`` for every docname, on ``tabs`` tabs of ``context``
    that each load page after page.

    A page loaded in a tab that already showed one of the site's pages reuses that tab's
    renderer process; a new tab per page started a renderer each time, about 0.3 CPU
    seconds of the 0.8 a page took (measured on 20 chapter pages, 2-core machine). A
    ``visit`` that changes the tab (its viewport, say) puts it back before it returns.
    """
    pending = iter(docnames)  # shared: each tab takes the next page when it is free

    async def tab() -> None:
        page = await context.new_page()
        try:
            for docname in pending:
                await visit(page, docname)
        finally:
            await page.close()

    await asyncio.gather(*(tab() for _ in range(tabs)))


def srgb_linear(channel: float) -> float:
    """One sRGB channel (0-1) made linear, as WCAG 2.1's relative luminance takes it."""
    return channel / 12.92 if channel <= 0.04045 else ((channel + 0.055) / 1.055) ** 2.4


def relative_luminance(rgb: tuple[float, float, float]) -> float:
    """WCAG 2.1's relative luminance of an sRGB colour (channels 0-1)."""
    r, g, b = (srgb_linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(one: tuple[float, float, float], other: tuple[float, float, float]) -> float:
    """WCAG 2.1's contrast ratio, (L1 + 0.05) / (L2 + 0.05), from 1 to 21."""
    light, dark = sorted((relative_luminance(one), relative_luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)
