"""Results tables for the book's pages, as MyST Markdown the page glues.

A page computes its rows with kvlib, builds the table here in a hidden cell, glues it,
and shows it with ``{glue:md} key`` and ``:format: myst``: Sphinx then renders a real
HTML table in the theme's style. The first column (the row's name) is left-aligned,
every other column right-aligned (numbers line up by their last digit), and the row
the text discusses is set in bold.
"""

from __future__ import annotations

from collections.abc import Sequence

from IPython.display import Markdown


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]],
                   mark: int | None = None) -> Markdown:
    """A MyST table: ``header`` (units in the names), ``rows``, row ``mark`` in bold."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"markdown_table: every row needs {len(header)} cells, one per "
                         f"header name; got lengths {[len(row) for row in rows]}")
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|:--" + "|--:" * (len(header) - 1) + "|"]
    for index, row in enumerate(rows):
        cells = [_cell(v) for v in row]
        if index == mark:
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return Markdown("\n".join(lines))  # type: ignore[no-untyped-call]
