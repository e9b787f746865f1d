"""Every graded assignment, through nbgrader: right answers score full, blanks and the
classic mistakes score nothing, and each mistake gets the hint that names it.

The assignments and their classic mistakes are listed in ``tests/assignments/``.
Right answers are the solution cells of ``solutions/`` themselves, so each student
(a different id, hence different numbers where a challenge draws them per student)
runs the reference solution on their own numbers.

Each assignment is one class of tests sharing one graded batch, so that pytest-xdist
(``--dist loadscope``) spreads the batches over its workers. nbgrader runs through its
Python API in this process (it is imported once, not once per command), and every
course starts from a copy of one empty gradebook (nbgrader creates a gradebook by
running ``alembic`` in a subprocess).
"""

from __future__ import annotations

import ast
import csv
import importlib
import pkgutil
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest

import assignments
from course.apps.autograde import COURSE_ID, is_test_cell
from course.apps.scratch import (
    call_nbgrader,
    generate_assignment,
    make_course,
    nbgrader_api,
    scripts_on_path,
)
from course.checks import HIDDEN_TEST_MODULES

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 20
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)

# One catalogue module per assignment (a01_kv_cache, ...); the modules beside them (the
# tests test_a02_paging, ..., and sweep, their shared machinery) are not catalogues.
CATALOGUE = re.compile(r"a\d\d_")
MODULES: dict[str, ModuleType] = {
    info.name: importlib.import_module(f"assignments.{info.name}")
    for info in pkgutil.iter_modules(assignments.__path__)
    if CATALOGUE.match(info.name)
}


def _source(module: ModuleType) -> Path:
    return ROOT / "solutions" / module.ASSIGNMENT / f"{module.NOTEBOOK}.ipynb"


def _grade_id(cell: Any) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _solution_answers(module: ModuleType) -> dict[str, str]:
    """The solution cells' sources without the solution markers, by grade id."""
    answers = {}
    for cell in nbformat.read(_source(module), as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            lines = [ln for ln in cell.source.splitlines() if ln.strip() not in (BEGIN, END)]
            answers[str(_grade_id(cell))] = "\n".join(lines)
    return answers


def _submission(release: Path, answers: dict[str, str]) -> Any:
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        if _grade_id(cell) in answers:
            cell.source = answers[str(_grade_id(cell))]
    return nb


@dataclass
class Batch:
    module: ModuleType
    course: Path
    tests: list[str]  # grade ids of the hidden tests
    points: dict[str, float]

    def graded(self, student: str) -> Any:
        path = self.course / "autograded" / student / self.module.ASSIGNMENT
        return nbformat.read(path / f"{self.module.NOTEBOOK}.ipynb", as_version=4)

    def errors(self, student: str, grade_id: str) -> str:
        for cell in self.graded(student).cells:
            if _grade_id(cell) == grade_id:
                return " ".join(
                    str(o.get("evalue", "")) for o in cell.outputs if o.output_type == "error"
                )
        raise KeyError(grade_id)

    def scores(self) -> dict[str, float]:
        with open(self.course / "grades.csv", newline="") as f:
            return {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}


@pytest.fixture(scope="session")
def empty_gradebook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty gradebook of the course, as nbgrader creates it (tables, alembic's
    version, the course row), to copy into each course."""
    from nbgrader.api import Gradebook

    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with scripts_on_path(), Gradebook(f"sqlite:///{path}", COURSE_ID):
        pass
    return path


def _export(course: Path) -> None:
    """``grades.csv``, as ``nbgrader export`` writes it with the course's export plugin."""
    from nbgrader.api import Gradebook

    from course.notebooks.flags import FlaggedCsvExport

    api = nbgrader_api(course)
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        FlaggedCsvExport(parent=api, to=str(course / "grades.csv")).export(gb)


@pytest.fixture(scope="class")
def batch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, empty_gradebook: Path
) -> Batch:
    """The assignment of the requesting class, graded by nbgrader for the students
    ``solution`` (the reference answers), ``blank`` (the release as it is) and
    ``wrong-<grade id>`` (the reference answers but one classic mistake)."""
    module = MODULES[request.cls.catalogue]
    assignment = module.ASSIGNMENT
    course = make_course(
        tmp_path_factory.mktemp(assignment), ROOT, [assignment], timeout_s=TIMEOUT_S
    )
    shutil.copyfile(empty_gradebook, course / "gradebook.db")
    generate_assignment(course, assignment)
    release = course / "exercises" / assignment / f"{module.NOTEBOOK}.ipynb"
    right = _solution_answers(module)
    students = {"solution": right, "blank": {}}
    for grade_id, (wrong, _) in module.WRONG.items():
        students[f"wrong-{grade_id}"] = {**right, f"answer_{grade_id}": wrong}
    for student, answers in students.items():
        path = course / "submitted" / student / assignment / f"{module.NOTEBOOK}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(release, answers), path)
    call_nbgrader(course, "autograde", assignment, "*", create=True)
    _export(course)
    source = nbformat.read(_source(module), as_version=4)
    tests = [str(_grade_id(c)) for c in source.cells if is_test_cell(c)]
    points = {str(_grade_id(c)): float(c.metadata["nbgrader"]["points"]) for c in source.cells
              if is_test_cell(c)}
    return Batch(module, course, tests, points)


class GradedAssignment:
    """The tests of one assignment's batch; ``catalogue`` names its module here."""

    catalogue: str

    def test_solution_scores_full_and_silently(self, batch: Batch) -> None:
        assert batch.scores()["solution"] == sum(batch.points.values())
        for cell in batch.graded("solution").cells:
            if cell.cell_type == "code":
                errors = [o for o in cell.outputs if o.output_type == "error"]
                assert errors == [], f"{_grade_id(cell)}: {errors}"

    def test_blank_scores_zero_and_says_what_is_missing(self, batch: Batch) -> None:
        assert batch.scores()["blank"] == 0
        for grade_id in batch.tests:
            assert "is still the placeholder `...`" in batch.errors("blank", grade_id), grade_id

    def test_each_classic_mistake_is_named(self, batch: Batch) -> None:
        assert set(batch.module.WRONG) == set(batch.tests), "one classic mistake per challenge"
        scores = batch.scores()
        for grade_id, (_, phrase) in batch.module.WRONG.items():
            student = f"wrong-{grade_id}"
            assert phrase in batch.errors(student, grade_id), f"{grade_id}: hint lacks {phrase!r}"
            others = sum(p for g, p in batch.points.items() if g != grade_id)
            assert scores[student] == others, f"{student}: only {grade_id} should be lost"


# One class per assignment: TestA01KvCache, ... (pytest collects the ``Test`` classes).
for _name in sorted(MODULES):
    _title = "".join(part.title() for part in _name.split("_"))
    globals()[f"Test{_title}"] = type(f"Test{_title}", (GradedAssignment,), {"catalogue": _name})


@pytest.mark.parametrize("name", sorted(MODULES))
def test_at_least_three_challenges(name: str) -> None:
    source = nbformat.read(_source(MODULES[name]), as_version=4)
    assert sum(is_test_cell(c) for c in source.cells) >= 3


@pytest.mark.parametrize("name", sorted(MODULES))
def test_hidden_tests_import_only_light_modules(name: str) -> None:
    """Hidden tests run in the grader's process: only the answer checks and stdlib-only
    kvlib modules."""
    for cell in nbformat.read(_source(MODULES[name]), as_version=4).cells:
        for block in HIDDEN.findall(cell.source):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.Import):
                    imported = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    imported = [node.module or ""]
                else:
                    continue
                for module in imported:
                    light = module in HIDDEN_TEST_MODULES or module in {"math", "fractions"}
                    assert light, (
                        f"{_grade_id(cell)} imports {module}: hidden tests may import "
                        f"math, fractions, {', '.join(HIDDEN_TEST_MODULES)}"
                    )


def _numbers_calls(source: str) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "numbers"
        ):
            calls.append(ast.dump(node))
    return calls


@pytest.mark.parametrize("name", sorted(MODULES))
def test_hidden_tests_draw_the_numbers_the_prompt_shows(name: str) -> None:
    """A hidden test that draws per-student numbers makes the same call as a visible cell."""
    visible: set[str] = set()
    hidden: list[tuple[str, str]] = []
    for cell in nbformat.read(_source(MODULES[name]), as_version=4).cells:
        if cell.cell_type != "code":
            continue
        blocks = HIDDEN.findall(cell.source)
        if blocks:
            hidden += [(str(_grade_id(cell)), call) for b in blocks for call in _numbers_calls(b)]
        elif not cell.metadata.get("nbgrader", {}).get("solution"):
            visible.update(_numbers_calls(cell.source))
    for grade_id, call in hidden:
        assert call in visible, f"{grade_id}: its numbers() call differs from the prompt's"
