"""Every released notebook, as a learner first meets it, runs from the top to the end.

Its first instruction is "run the notebook from the top, so each challenge's numbers are
printed": Jupyter's Run All stops at the first cell that raises, so no cell of a blank
notebook may raise. Each exercise is run here as Run All runs it in JupyterLab (every
cell in order, the cells tagged ``skip-execution`` for the book's build included, stop on
the first error) in a real IPython kernel: every challenge prints its numbers, every
visible check says its challenge is not answered yet, and the hidden tests still score
the blank answers nothing (``test_assignments``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[2]
RELEASED = sorted((ROOT / "exercises").glob("*/*.ipynb"))


def _grade_id(cell: Any) -> str:
    return str(cell.metadata.get("nbgrader", {}).get("grade_id", ""))


def _text(cell: Any) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream")


@pytest.mark.parametrize("released", RELEASED, ids=lambda p: p.parent.name)
def test_run_all_reaches_the_end_of_a_blank_notebook(released: Path, tmp_path: Path) -> None:
    copy = tmp_path / released.name
    shutil.copy(released, copy)
    nb = nbformat.read(copy, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("tags", None)  # JupyterLab runs every cell
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    by_id = {_grade_id(c): c for c in nb.cells if _grade_id(c)}
    challenges = [g[len("answer_"):] for g in by_id if g.startswith("answer_")]
    assert len(challenges) >= 3
    for challenge in challenges:
        assert _text(by_id[f"numbers_{challenge}"]).strip(), challenge
        check = _text(by_id[f"check_{challenge}"])
        assert "is not answered yet: replace the ... in the cell above" in check, challenge
        assert by_id[challenge].get("outputs", []) == [], challenge  # a hidden test: silent
    # The last cell ran: "Check your work" graded the saved blank copy, each challenge
    # missed as unanswered, and nothing raised on the way.
    report = _text(nb.cells[-1])
    assert re.search(r": 0 / \d+ points", report), report
    for challenge in challenges:
        assert "is still the placeholder `...`" in report.split(f"  {challenge} ", 1)[1].split(
            "\n", 1)[0], challenge
