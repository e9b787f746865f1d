"""Measure how the chapter pages read: the code a reader sees, and the outputs' shape.

Per chapter page (``book/NN_slug/*.md`` named in ``_toc.yml``, reading order):

- **visible code lines**: non-blank lines of the code cells whose input the page shows,
  that is cells tagged none of ``hide-input``, ``remove-input``, ``remove-cell`` (a
  ``hide-input`` cell sits folded behind "show code"). Read from the MyST sources, so it
  needs no build; ``--ref REV`` reads the sources of a git revision instead.
- **longest text output line**, **text outputs that are tables**, **HTML tables**: read
  from a built site (``--html DIR``, e.g. ``_build/html``), since outputs exist only
  after the pages ran. A text output is tabular when three or more of its lines hold
  two or more columns separated by runs of two or more spaces, or by ``|``.

Usage: ``python scripts/measure_pages.py [--html _build/html] [--ref HEAD] [--json]``.
The summary gives the median visible code lines per chapter page, the pages over
``CODE_LINE_LIMIT``, the text output lines over ``TEXT_WIDTH_LIMIT`` characters and the
HTML tables. The site tests (tests/site/test_reading.py) import the parsing functions.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_LINE_LIMIT = 40  # visible code lines on one page (pages about code excepted)
MEDIAN_CODE_LINE_LIMIT = 12  # median over a chapter's pages
TEXT_WIDTH_LIMIT = 100  # characters in one line of text output
# Pages whose lesson is the code itself: they may show more than CODE_LINE_LIMIT lines.
PAGES_ABOUT_CODE = frozenset({"book/06_timing/01_timing_gpu_code"})
HIDING_TAGS = frozenset({"hide-input", "remove-input", "remove-cell"})
# A visible cell that needs a service the site does not run (a Redis server): the page
# says so beside it and shows its recorded output; the copy-and-run test skips it.
NOT_ON_SITE_TAG = "skip-copy-run"
CHAPTER_DOC = re.compile(r"^book/\d\d_[a-z0-9_]+/")

_FENCE = re.compile(r"^(`{3,}|~{3,})\{code-cell\}")
_TAGS_OPTION = re.compile(r"^:tags:\s*\[(.*)\]\s*$")


@dataclass(frozen=True)
class CodeCell:
    """One ``{code-cell}`` of a MyST page: its code, its tags, its first line (1-based)."""

    source: str
    tags: frozenset[str]
    line: int

    @property
    def shown(self) -> bool:
        """True when the page shows this cell's input unfolded."""
        return not (self.tags & HIDING_TAGS)

    @property
    def code_lines(self) -> int:
        return sum(1 for line in self.source.splitlines() if line.strip())


def _parse_tags(value: str) -> frozenset[str]:
    return frozenset(t.strip().strip("'\"") for t in value.split(",") if t.strip())


def code_cells(text: str) -> list[CodeCell]:
    """The code cells of a MyST page, in order, with their tags.

    Options come as ``:key: value`` lines after the fence, or as a ``---`` YAML block
    (only its ``tags`` list is read).
    """
    cells: list[CodeCell] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, start = match.group(1), i + 1
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != fence:
            j += 1
        body = lines[i + 1 : j]
        tags: frozenset[str] = frozenset()
        if body and body[0].strip() == "---":
            end = next((k for k in range(1, len(body)) if body[k].strip() == "---"), 0)
            for option in body[1:end]:
                key, _, value = option.partition(":")
                if key.strip() == "tags":
                    tags = _parse_tags(value.strip().strip("[]"))
            body = body[end + 1 :]
        else:
            while body and body[0].startswith(":"):
                tag_match = _TAGS_OPTION.match(body[0])
                if tag_match:
                    tags = _parse_tags(tag_match.group(1))
                body = body[1:]
        cells.append(CodeCell("\n".join(body), tags, start))
        i = j + 1
    return cells


def visible_code_lines(text: str) -> int:
    """Non-blank lines of the cells a page shows unfolded."""
    return sum(cell.code_lines for cell in code_cells(text) if cell.shown)


def _toc_files(entries: list[dict[str, object]]) -> list[str]:
    names: list[str] = []
    for entry in entries:
        if "file" in entry:
            names.append(re.sub(r"\.(md|ipynb)$", "", str(entry["file"])))
        for key in ("parts", "chapters", "sections"):
            children = entry.get(key, [])
            if isinstance(children, list):
                names += _toc_files(children)
    return names


def toc_docnames(toc_text: str) -> list[str]:
    """Every page named in a _toc.yml, the root first, in reading order (no extension)."""
    import yaml

    toc = yaml.safe_load(toc_text)
    root = re.sub(r"\.(md|ipynb)$", "", str(toc["root"]))
    return [root, *_toc_files(toc.get("parts", []) + toc.get("chapters", []))]


def chapter_docnames(toc_text: str) -> list[str]:
    """Chapter pages named in a _toc.yml (``book/NN_slug/...``), in reading order."""
    return [d for d in toc_docnames(toc_text) if CHAPTER_DOC.match(d)]


def chapter_of(docname: str) -> str:
    return docname.split("/")[1]


class _OutputScan(HTMLParser):
    """Collects the text outputs and counts the tables of one built page's article."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.output_depth: int | None = None  # depth of the open div.cell_output
        self.pre_depth: int | None = None
        self.current: list[str] = []
        self.text_outputs: list[str] = []
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "table":
            self.tables += 1
        if tag in _VOID:
            return
        self.depth += 1
        if tag == "div" and "cell_output" in classes and self.output_depth is None:
            self.output_depth = self.depth
        if tag == "pre" and self.output_depth is not None and self.pre_depth is None:
            self.pre_depth = self.depth
            self.current = []

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self.pre_depth == self.depth:
            self.text_outputs.append("".join(self.current))
            self.pre_depth = None
        if self.output_depth == self.depth:
            self.output_depth = None
        self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.pre_depth is not None:
            self.current.append(data)


_VOID = frozenset({"br", "img", "hr", "input", "meta", "link", "col", "area", "base", "wbr",
                   "source", "embed", "param", "track"})
_COLUMN_GAP = re.compile(r"\S(?: {2,}|\s*\|\s*)\S")


def is_tabular(output: str) -> bool:
    """True when three or more lines of a text output hold columns (see module doc)."""
    rows = [line for line in output.splitlines() if len(_COLUMN_GAP.findall(line)) >= 1]
    return len(rows) >= 3


@dataclass(frozen=True)
class OutputShape:
    """What a built page prints: text outputs and HTML tables in its article."""

    longest_text_line: int
    long_text_lines: int  # lines over TEXT_WIDTH_LIMIT
    tabular_text_outputs: int
    html_tables: int


def _article(page_html: str) -> str:
    start = page_html.find('<article class="bd-article"')
    end = page_html.find("</article>", start)
    return page_html[start:end] if start >= 0 and end > start else page_html


def output_shape(page_html: str) -> OutputShape:
    """Text output lines and tables of one built page (myst-nb's HTML)."""
    scan = _OutputScan()
    scan.feed(_article(page_html))
    lines = [html.unescape(line) for out in scan.text_outputs for line in out.splitlines()]
    widths = [len(line.rstrip()) for line in lines]
    return OutputShape(
        longest_text_line=max(widths, default=0),
        long_text_lines=sum(w > TEXT_WIDTH_LIMIT for w in widths),
        tabular_text_outputs=sum(is_tabular(out) for out in scan.text_outputs),
        html_tables=scan.tables,
    )


@dataclass(frozen=True)
class PageFigures:
    docname: str
    visible_code_lines: int
    shape: OutputShape | None


def _read(path: str, ref: str | None) -> str:
    """A repository file, as in the working tree or at git revision ``ref``."""
    if ref is None:
        return (ROOT / path).read_text(encoding="utf-8")
    return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def measure(html_dir: Path | None, ref: str | None) -> list[PageFigures]:
    """Figures of every chapter page; output shapes only where ``html_dir`` has the page."""
    toc = _read("_toc.yml", ref)
    figures = []
    for docname in chapter_docnames(toc):
        shape = None
        if html_dir is not None:
            page = html_dir / f"{docname}.html"
            if page.is_file():
                shape = output_shape(page.read_text(encoding="utf-8", errors="replace"))
        figures.append(PageFigures(docname, visible_code_lines(_read(f"{docname}.md", ref)),
                                   shape))
    return figures


def summary(figures: list[PageFigures]) -> dict[str, object]:
    """The book-wide figures: median code lines, pages over the limits, tables."""
    code = [f.visible_code_lines for f in figures]
    built = [f for f in figures if f.shape is not None]
    by_chapter: dict[str, list[int]] = {}
    for f in figures:
        by_chapter.setdefault(chapter_of(f.docname), []).append(f.visible_code_lines)
    result: dict[str, object] = {
        "pages": len(figures),
        "median_visible_code_lines": statistics.median(code) if code else 0,
        "chapter_medians": {c: statistics.median(v) for c, v in by_chapter.items()},
        f"pages_over_{CODE_LINE_LIMIT}_code_lines": sum(
            f.visible_code_lines > CODE_LINE_LIMIT and f.docname not in PAGES_ABOUT_CODE
            for f in figures
        ),
        "pages_measured_from_html": len(built),
    }
    if built:
        shapes = [f.shape for f in built if f.shape is not None]
        result |= {
            f"text_lines_over_{TEXT_WIDTH_LIMIT}": sum(s.long_text_lines for s in shapes),
            f"pages_with_text_lines_over_{TEXT_WIDTH_LIMIT}": sum(
                s.long_text_lines > 0 for s in shapes),
            "tabular_text_outputs": sum(s.tabular_text_outputs for s in shapes),
            "html_tables": sum(s.html_tables for s in shapes),
        }
    return result


def _table(figures: list[PageFigures]) -> str:
    rows = [f"{'page':<46} {'code':>5} {'longest':>8} {'txt tbl':>8} {'html tbl':>8}"]
    for f in figures:
        s = f.shape
        cells = ("-", "-", "-") if s is None else (
            s.longest_text_line, s.tabular_text_outputs, s.html_tables)
        mark = "*" if f.visible_code_lines > CODE_LINE_LIMIT else " "
        rows.append(f"{f.docname.removeprefix('book/'):<46} {f.visible_code_lines:>4}{mark} "
                    f"{cells[0]:>8} {cells[1]:>8} {cells[2]:>8}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, help="built site, e.g. _build/html")
    parser.add_argument("--ref", help="read the sources of this git revision")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.html is not None and not (args.html / "index.html").is_file():
        parser.error(f"--html {args.html}: no index.html there; build the site first "
                     "(scripts/build_book.py)")
    figures = measure(args.html, args.ref)
    if args.json:
        print(json.dumps({"pages": [asdict(f) for f in figures], "summary": summary(figures)},
                         indent=1))
    else:
        print(_table(figures))
        for key, value in summary(figures).items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
