"""How the chapter pages read: code out of the reader's way, no wide text, no page scroll.

The limits and the parsing are scripts/measure_pages.py's (run it for the figures):

- from the page sources: at most CODE_LINE_LIMIT visible code lines on a page (pages
  about code excepted), and a chapter median of at most MEDIAN_CODE_LINE_LIMIT;
- from the built site (the one test_site.py builds): no line of text output wider than
  TEXT_WIDTH_LIMIT characters;
- in headless Chromium at 1280, 390 and 320 px: the page never scrolls sideways (a wide
  table or formula may scroll inside its own box);
- from the page sources: every vLLM or transformers source path in the prose links the
  file at a named commit (vLLM) or at the tag of the pinned transformers version, one
  commit per file throughout the book, and no code cell names such a path (a comment
  cannot link it).
"""

from __future__ import annotations

import ast
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from site_helpers import ROOT, ensure_site
from site_tour import WIDTHS

sys.path.insert(0, str(ROOT / "scripts"))

from measure_pages import (  # noqa: E402
    CODE_LINE_LIMIT,
    MEDIAN_CODE_LINE_LIMIT,
    PAGES_ABOUT_CODE,
    TEXT_WIDTH_LIMIT,
    chapter_docnames,
    chapter_of,
    code_cells,
    output_shape,
    visible_code_lines,
)

PAGES = chapter_docnames((ROOT / "_toc.yml").read_text(encoding="utf-8"))
CHAPTERS = sorted({chapter_of(d) for d in PAGES})


def _source(docname: str) -> str:
    return (ROOT / f"{docname}.md").read_text(encoding="utf-8")


def test_the_parser_sees_tags_and_options() -> None:
    """The measure counts what the page shows: tagged cells are out, blank lines too."""
    page = (
        "```{code-cell} ipython3\nx = 1\n\ny = 2\n```\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\nplot()\n```\n"
        "```{code-cell} ipython3\n---\ntags: [remove-cell]\nmystnb:\n  figure:\n"
        "    name: f\n---\nglue()\n```\n"
        "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    name: g\n---\nshown()\n```\n"
    )
    cells = code_cells(page)
    assert [sorted(c.tags) for c in cells] == [[], ["hide-input"], ["remove-cell"], []]
    assert [c.source for c in cells] == ["x = 1\n\ny = 2", "plot()", "glue()", "shown()"]
    assert visible_code_lines(page) == 3


def test_every_chapter_is_measured() -> None:
    assert len(CHAPTERS) >= 7 and len(PAGES) >= 7 * 5
    missing = [d for d in PAGES if not (ROOT / f"{d}.md").is_file()]
    assert not missing, missing


@pytest.mark.parametrize("docname", PAGES)
def test_visible_code_fits_a_page(docname: str) -> None:
    if docname in PAGES_ABOUT_CODE:
        pytest.skip("a page about code may show it")
    lines = visible_code_lines(_source(docname))
    assert lines <= CODE_LINE_LIMIT, (
        f"{lines} visible code lines (limit {CODE_LINE_LIMIT}): move plotting, table "
        "formatting and set-up behind `:tags: [hide-input]`, or into a small helper"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_median_code_lines(chapter: str) -> None:
    lines = {d: visible_code_lines(_source(d)) for d in PAGES if chapter_of(d) == chapter}
    median = statistics.median(lines.values())
    assert median <= MEDIAN_CODE_LINE_LIMIT, (
        f"median {median} visible code lines (limit {MEDIAN_CODE_LINE_LIMIT}): {lines}"
    )


@pytest.fixture(scope="module")
def built_site() -> Path:
    return ensure_site()


@pytest.mark.site
@pytest.mark.parametrize("docname", PAGES)
def test_text_outputs_fit(built_site: Path, docname: str) -> None:
    page = built_site / f"{docname}.html"
    shape = output_shape(page.read_text(encoding="utf-8", errors="replace"))
    assert shape.long_text_lines == 0, (
        f"{shape.long_text_lines} text output line(s) over {TEXT_WIDTH_LIMIT} characters "
        f"(longest {shape.longest_text_line}): print a table as a glued Markdown table, "
        "or wrap the text"
    )


@pytest.fixture(scope="module")
def overflow(site_tour: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Every chapter page at each width in WIDTHS: how far it scrolls sideways. The site's
    tour (tests/site_tour.py) loads each page once, at the widest width, then narrows it
    in place: a second load would typeset its math again for nothing."""
    return {(docname, int(width)): seen
            for docname, page in site_tour["pages"].items()
            for width, seen in page["overflow"].items()}


@pytest.mark.site
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("docname", PAGES)
def test_no_sideways_page_scroll(
    overflow: dict[tuple[str, int], dict[str, Any]], docname: str, width: int
) -> None:
    seen = overflow[docname, width]
    assert seen["scrollWidth"] <= seen["clientWidth"] + 1, (
        f"the page is {seen['scrollWidth']} px wide in a {seen['clientWidth']} px window; "
        f"sticking out: {seen['wide']}"
    )


def test_calculator_table_rows_are_the_commands_own() -> None:
    """The calculator's HTML table holds the `kvlib size` table, split, not recomputed."""
    sys.path.insert(0, str(ROOT / "book" / "calculator_assets"))
    import kvcalc

    result = kvcalc.compute({"model": "Llama-3.1-8B", "gpu": "H100-SXM", "context": "4096"})
    assert result["status"] == 0, result
    rows = result["rows"]
    lines = [line for line in result["table"].splitlines() if line.strip()]
    assert len(rows) == len(lines)
    for (label, value), line in zip(rows, lines, strict=True):
        assert line.split() == f"{label} {value}".split(), (line, label, value)
        assert "  " not in label
    seats = [value for label, value in rows if label.startswith("seats at")]
    assert seats == [str(json.loads(result["json"])["seats"])]


# A vLLM or transformers source path as the prose writes it, in backticks.
SOURCE_PATH = re.compile(r"`((?:vllm|transformers)/[^`\s]*)`")
# A Markdown link whose text is one backticked path: [`path`](url).
LINKED_PATH = re.compile(r"\[`([^`\s]+)`\]\(([^)\s]+)\)")
VLLM_LINK = re.compile(
    r"https://github\.com/vllm-project/vllm/(?:blob|tree)/(?P<commit>[0-9a-f]{7,40})/(?P<path>\S+)"
)
TRANSFORMERS_LINK = re.compile(
    r"https://github\.com/huggingface/transformers/blob/v(?P<version>[^/]+)/src/(?P<path>\S+)"
)
# A path of either source inside a code cell, where no link can go.
CODE_SOURCE_PATH = re.compile(r"(?<![\w/.-])(?:vllm|transformers)/[\w/.-]+\.py\b")
BOOK_PAGES = sorted((ROOT / "book").glob("**/*.md"))


def pinned_transformers() -> str:
    """The transformers version requirements.txt pins (the one the oracles ran)."""
    found = re.search(r"^transformers==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert found, "requirements.txt pins no transformers version"
    return found.group(1)


def prose(text: str) -> str:
    """The page without its fenced blocks (code cells, directives' code, logs)."""
    kept: list[str] = []
    fence = ""
    for line in text.splitlines():
        opener = re.match(r"^\s*(`{3,}|~{3,})", line)
        if not fence and opener:
            fence = opener.group(1)
        elif fence and line.strip() == fence:
            fence = ""
        elif not fence:
            kept.append(line)
    return "\n".join(kept)


def source_citations(text: str, transformers_version: str) -> tuple[dict[str, str], list[str]]:
    """The vLLM files a page links, with their commits, and what is wrong with the rest.

    A problem is a source path that is not the text of a link, a link to a branch, a
    link whose path differs from its text, a transformers link at another version than
    the pinned one, or a source path in a code cell.
    """
    body = prose(text)
    commits: dict[str, str] = {}
    problems: list[str] = []
    linked_spans: list[tuple[int, int]] = []
    for link in LINKED_PATH.finditer(body):
        shown, url = link.groups()
        if not shown.startswith(("vllm/", "transformers/", "docs/")):
            continue
        linked_spans.append(link.span())
        vllm = VLLM_LINK.fullmatch(url)
        hf = TRANSFORMERS_LINK.fullmatch(url)
        if vllm and vllm["path"].rstrip("/") == shown.rstrip("/"):
            commits[shown] = vllm["commit"]
        elif hf and hf["path"] == shown and hf["version"] == transformers_version:
            continue
        else:
            problems.append(
                f"`{shown}` links {url}, not the file at a commit or at "
                f"transformers v{transformers_version}"
            )
    for path in SOURCE_PATH.finditer(body):
        if not any(start <= path.start() < end for start, end in linked_spans):
            problems.append(f"`{path.group(1)}` is not linked at a commit")
    problems += [
        f"code cell names `{found}`: cite it in the prose, where it can be linked"
        for cell in code_cells(text)
        for found in CODE_SOURCE_PATH.findall(cell.source)
    ]
    return commits, problems


def test_source_citation_check_catches_unlinked_and_unpinned_paths() -> None:
    url = "https://github.com/vllm-project/vllm/blob/{}/vllm/envs.py"
    page = (
        "Linked: [`vllm/envs.py`](" + url.format("5d4420da4338") + ").\n"
        "Bare: `vllm/config/cache.py`.\n"
        "Branch: [`vllm/envs.py`](" + url.format("main") + ").\n"
        "Other tag: [`transformers/x.py`](https://github.com/huggingface/transformers/"
        "blob/v4.0.0/src/transformers/x.py).\n"
        "```{code-cell} ipython3\n# see vllm/attention/layer.py\n```\n"
    )
    commits, problems = source_citations(page, "5.23.0")
    assert commits == {"vllm/envs.py": "5d4420da4338"}
    assert len(problems) == 4, problems
    assert "`vllm/config/cache.py` is not linked" in problems[-2]
    assert "vllm/attention/layer.py" in problems[-1]


@pytest.mark.parametrize("page", BOOK_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sources_are_linked_at_a_commit(page: Path) -> None:
    _, problems = source_citations(page.read_text(encoding="utf-8"), pinned_transformers())
    assert not problems, problems


def test_each_vllm_file_is_cited_at_one_commit() -> None:
    """One voice: a file read at one commit is linked at that commit on every page."""
    seen: dict[str, dict[str, list[str]]] = {}
    for page in BOOK_PAGES:
        commits, _ = source_citations(page.read_text(encoding="utf-8"), pinned_transformers())
        for path, commit in commits.items():
            seen.setdefault(path, {}).setdefault(commit, []).append(page.name)
    assert seen, "no vLLM source is linked anywhere in the book"
    split = {path: pages for path, pages in seen.items() if len(pages) > 1}
    assert not split, split


def names_defined_and_used(source: str) -> tuple[set[str], set[str]]:
    """The names a cell binds (assignments, imports, defs, arguments) and the names it reads.

    IPython's ``%`` and ``!`` lines are left out; a cell that is not Python binds and
    reads nothing.
    """
    code = "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
    )
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(), set()
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


def names_only_removed_cells_define(text: str) -> list[tuple[int, list[str]]]:
    """Cells a reader can see (shown, or behind "show code") that read a name which, before
    them, only a removed cell bound: (line of the cell, the names)."""
    seen: set[str] = set()
    removed: set[str] = set()
    found: list[tuple[int, list[str]]] = []
    for cell in code_cells(text):
        bound, read = names_defined_and_used(cell.source)
        if cell.tags & {"remove-cell", "remove-input"}:
            removed |= bound
            continue
        missing = sorted((read - bound - seen) & removed)
        if missing:
            found.append((cell.line, missing))
        seen |= bound
    return found


def test_removed_name_check_catches_a_hidden_definition() -> None:
    page = (
        "```{code-cell} ipython3\n:tags: [remove-cell]\nT = 8\n```\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\nimport math\nprint(math.pi * T)\n```\n"
        "```{code-cell} ipython3\nT = 9\nprint(T)\n```\n"
    )
    assert names_only_removed_cells_define(page) == [(5, ["T"])]


@pytest.mark.parametrize("docname", PAGES)
def test_code_behind_show_code_runs_when_copied(docname: str) -> None:
    """A reader who copies what the page shows, folded cells included, needs nothing the
    page removed (test_copy_run.py runs the unfolded cells; this reads the folded ones)."""
    found = names_only_removed_cells_define(_source(docname))
    assert not found, (
        f"cells at lines {found} read names only a `remove-cell` defines: define them in "
        "the cell, show the set-up (`hide-input`), or move the glue into a removed cell"
    )
