"""course.book.tables: the MyST tables the book's pages glue."""

from __future__ import annotations

import pytest

from course.book.tables import markdown_table


def test_first_column_left_others_right_aligned() -> None:
    table = markdown_table(["model", "KV (KiB/token)", "seats"], [["a", 128, 3], ["b", 64, 7]])
    lines = table.data.splitlines()
    assert lines[0] == "| model | KV (KiB/token) | seats |"
    assert lines[1] == "|:--|--:|--:|"
    assert lines[2:] == ["| a | 128 | 3 |", "| b | 64 | 7 |"]


def test_marked_row_is_bold_and_pipes_are_escaped() -> None:
    table = markdown_table(["name", "value"], [["x|y", 1], ["z", ""]], mark=1)
    lines = table.data.splitlines()
    assert lines[2] == "| x\\|y | 1 |"
    # An empty cell stays empty: "****" would render as a horizontal rule.
    assert lines[3] == "| **z** |  |"


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        markdown_table(["a", "b"], [[1, 2, 3]])
