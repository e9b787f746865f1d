"""The plain nbgrader command line on chapter 1, in a temporary course, with the course's config.

One class (``grading_support.CLASS``: right, blank and classically wrong answers,
each on the student's own numbers, and a few submissions that need repairing)
is generated, submitted, autograded, given feedback and exported with
``nbgrader`` itself, one command each, as an instructor without ``make`` would.
The same class graded by ``make grade`` is compared with this one in
``test_grading_batch.py``; attacks and accidents are in
``test_grading_adversarial.py``.
"""

from __future__ import annotations

import filecmp
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grading_support import (
    ASSIGNMENT,
    CHALLENGES,
    CLASS,
    CLASSIC_WRONG,
    NOTEBOOK,
    ROOT,
    errors,
    expected,
    grade_id,
    graded_class,
    grades,
    read,
)

from course.apps.autograde import is_test_cell

pytestmark = pytest.mark.notebooks

STUDENTS = sorted(CLASS)


@dataclass
class Batch:
    course: Path

    def graded(self, student: str) -> Any:
        return read(self.course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")

    def feedback(self, student: str) -> str:
        return (self.course / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Batch:
    serial, _, _ = graded_class(tmp_path_factory)
    return Batch(serial)


def test_scores_and_flags(batch: Batch) -> None:
    rows = grades(batch.course)
    assert {s: float(row["score"]) for s, row in rows.items()} == {
        s: score for s, (score, _) in CLASS.items()
    }
    for student, (_, flag) in CLASS.items():
        assert flag in rows[student]["flags"] and bool(flag) == bool(rows[student]["flags"])


def test_solution_passes_silently(batch: Batch) -> None:
    for cell in batch.graded("right_1").cells:
        if cell.cell_type == "code":
            assert [o for o in cell.outputs if o.output_type == "error"] == [], grade_id(cell)


def test_blank_release_says_what_is_missing(batch: Batch) -> None:
    for name in CHALLENGES:
        assert f"{name} is still the placeholder `...`" in errors(batch.graded("blank"), name)


@pytest.mark.parametrize("name", CHALLENGES)
def test_classic_mistake_is_named(batch: Batch, name: str) -> None:
    graded = batch.graded(f"wrong_{name}")
    assert CLASSIC_WRONG[name][1] in errors(graded, name)
    assert all(errors(graded, other) == "" for other in CHALLENGES if other != name)


def test_test_cells_never_ran_in_kernel(batch: Batch) -> None:
    for student in STUDENTS:
        for cell in batch.graded(student).cells:
            if is_test_cell(cell):
                assert cell.execution_count is None


def test_self_check_cell_not_run_by_the_grader(batch: Batch) -> None:
    cell = batch.graded("right_1").cells[-1]
    assert grade_id(cell) == "self_check" and cell.outputs == []


@pytest.mark.parametrize("student", STUDENTS)
def test_feedback_has_no_hidden_test_or_expected_value(batch: Batch, student: str) -> None:
    html = batch.feedback(student)
    for secret in ("HIDDEN TESTS", "mistakes={", "seats_that_fit", "right = "):
        assert secret not in html
    # What the grader and the checks wrote (prompts print the student's own numbers).
    right = expected(student)
    for cell in batch.graded(student).cells:
        name = grade_id(cell) or ""
        if name in CHALLENGES or name.startswith("check_"):
            text = " ".join(str(o.get("evalue", o.get("text", ""))) for o in cell.outputs)
            for value in right.values():
                shown = {f"{value:,}", str(value)} if isinstance(value, int) else {f"{value:.3g}"}
                assert not any(re.search(rf"\b{re.escape(v)}\b", text) for v in shown), text


def test_feedback_shows_the_hint_and_the_notes(batch: Batch) -> None:
    assert CLASSIC_WRONG["seats"][1] in batch.feedback("wrong_seats")
    assert "Notes from the grader" in batch.feedback("duplicated")
    assert "Notes from the grader" not in batch.feedback("right_1")


def test_repository_course_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """nbgrader_config.py at the root: the course layout, limits, verified tests, no leaks."""
    from nbgrader.preprocessors import ClearHiddenTests, Execute
    from traitlets.config.loader import PyFileConfigLoader

    from course.apps.autograde import VerifiedExecute
    from course.notebooks.flags import FlaggedCsvExport, FlagsInFeedback
    from course.notebooks.intake import RepairingExporter

    monkeypatch.delenv("KVLIB_GRADEBOOK_URL", raising=False)
    c = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert c.CourseDirectory.root == str(ROOT)
    assert c.CourseDirectory.source_directory == "solutions"
    assert c.CourseDirectory.release_directory == "exercises"
    assert "db_url" not in c.CourseDirectory  # SQLite in the course folder, nbgrader's default
    assert 0 < c.Execute.timeout <= 120
    assert VerifiedExecute in c.Autograde.autograde_preprocessors
    assert Execute not in c.Autograde.autograde_preprocessors
    assert c.Autograde.exporter_class is RepairingExporter
    assert ClearHiddenTests in c.GenerateFeedback.preprocessors
    assert FlagsInFeedback in c.GenerateFeedback.preprocessors
    assert c.ExportApp.plugin_class is FlaggedCsvExport
    assert c.SandboxedKernelManager.mode == "require"
    assert c.SandboxedKernelManager.memory_bytes == 2 * 2**30


def test_gradebook_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("KVLIB_GRADEBOOK_URL", "postgresql://grader@127.0.0.1/course")
    c = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert c.CourseDirectory.db_url == "postgresql://grader@127.0.0.1/course"


def test_committed_exercises_match_a_fresh_release(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release.py"), "--output", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed_root = ROOT / "exercises"
    committed = sorted(
        p.relative_to(committed_root) for p in committed_root.rglob("*") if p.is_file()
    )
    assert fresh == committed, "run `make release` and commit exercises/"
    match, mismatch, errors_ = filecmp.cmpfiles(tmp_path, committed_root, fresh, shallow=False)
    assert mismatch == [] and errors_ == [], "run `make release` and commit exercises/"


def test_exercises_do_not_import_torch() -> None:
    # A prompt may name a torch call (CUDA's total, `torch.cuda.mem_get_info`); code may not
    # import it, nor anything that does (transformers).
    imports = re.compile(r"^\s*(?:import|from)\s+(?:torch|transformers)\b", re.MULTILINE)
    for path in (ROOT / "exercises").rglob("*.ipynb"):
        for cell in read(path).cells:
            if cell.cell_type == "code":
                assert not imports.search(cell.source), f"{path}: exercises must not import torch"


def test_released_notebook_holds_no_expected_value() -> None:
    """The prompts draw numbers when run; the file itself has no outputs and no hidden test."""
    nb = read(ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    for cell in nb.cells:
        assert "BEGIN HIDDEN" not in cell.source and "BEGIN SOLUTION" not in cell.source
        assert cell.cell_type != "code" or cell.outputs == []


def test_solution_runs_top_to_bottom_without_torch() -> None:
    """The source notebook, explore cells included (the grader skips those), runs clean."""
    from nbclient import NotebookClient

    nb = read(ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    nb.cells = [c for c in nb.cells if grade_id(c) != "self_check"]  # it would grade itself
    probe = "import sys\nprint(sorted({'torch', 'transformers'} & set(sys.modules)))"
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    NotebookClient(nb, timeout=120, skip_cells_with_tag="", kernel_name="python3").execute()
    errors_ = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors_ == []
    explore = [c for c in nb.cells if "skip-execution" in c.metadata.get("tags", [])]
    assert explore and all(c.outputs for c in explore)
    assert nb.cells[-1].outputs[0]["text"].strip() == "[]"
