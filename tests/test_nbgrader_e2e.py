"""The whole nbgrader pipeline on chapter 1, with the real CLI, in a temporary course.

One batch of students is generated, submitted, autograded, given feedback and
exported once (module fixture); each test then checks one student or one
artefact. The students include the solution, a blank release, the classic
wrong answer of each challenge and several cheats.
"""

from __future__ import annotations

import csv
import filecmp
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grading_support import (
    ALWAYS_EQUAL,
    ASSIGNMENT,
    CHALLENGES,
    CLASSIC_WRONG,
    MONKEYPATCH,
    NOTEBOOK,
    READ_SOLUTIONS,
    RIGHT,
    ROOT,
    read,
    submission,
    write,
)

from kvlib.grading.autograde import is_test_cell
from kvlib.grading.course import make_course, run_nbgrader

pytestmark = pytest.mark.notebooks

TIMEOUT_S = 5
POINTS = 2.0

INFINITE_LOOP = "while True:\n    pass"
# Ignores SIGINT and swallows KeyboardInterrupt: only a kernel restart stops it.
STUBBORN_LOOP = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    try:
        time.sleep(0.05)
    except BaseException:
        pass
"""


def _students() -> dict[str, dict[str, str]]:
    students: dict[str, dict[str, str]] = {"solution": dict(RIGHT), "blank": {}}
    for name, (wrong, _) in CLASSIC_WRONG.items():
        students[f"wrong_{name}"] = {**RIGHT, f"answer_{name}": wrong}
    students["always_equal"] = {"answer_bytes_per_token": ALWAYS_EQUAL}
    students["infinite_loop"] = {**RIGHT, "answer_seats": INFINITE_LOOP}
    students["stubborn_loop"] = {**RIGHT, "answer_seats": STUBBORN_LOOP}
    students["exits_kernel"] = {**RIGHT, "answer_seats": "import os\nos._exit(0)"}
    students["edited_test"] = {
        **RIGHT,
        "answer_seats": "seats = 1",
        "seats": '"""Check seats."""\nprint("all good")',
    }
    students["monkeypatch"] = {
        **RIGHT,
        "answer_bytes_per_token": MONKEYPATCH,
        "answer_seats": "seats = 3",
        "answer_prefill_s": "prefill_s = 123.0",
    }
    students["reads_solutions"] = {"answer_bytes_per_token": READ_SOLUTIONS}
    students["numpy_answers"] = {
        "answer_bytes_per_token": "import numpy as np\n"
        "bytes_per_token = np.int64(2 * 48 * 8 * 128)",
        "answer_seats": "seats = np.int32(30 * 2**30 // (10_000 * 131_072))",
        "answer_prefill_s": "prefill_s = np.float64(2 * 32e9 * 6000 / 400e12)",
    }
    students["deleted_test"] = {**RIGHT, "seats": DELETE}
    return students


DELETE = "<delete this cell>"
STUDENTS = _students()
EXPECTED_SCORE = {
    "solution": 6.0,
    "blank": 0.0,
    "wrong_bytes_per_token": 4.0,
    "wrong_seats": 4.0,
    "wrong_prefill_s": 4.0,
    "always_equal": 0.0,
    "infinite_loop": 4.0,
    "stubborn_loop": 4.0,
    "exits_kernel": 4.0,
    "edited_test": 4.0,
    "monkeypatch": 0.0,
    "reads_solutions": 0.0,
    "numpy_answers": 6.0,
    "deleted_test": 4.0,
}


@dataclass
class Batch:
    course: Path
    log: str

    def graded(self, student: str) -> Any:
        return read(self.course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")

    def outputs(self, student: str, grade_id: str) -> list[Any]:
        for cell in self.graded(student).cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
                return list(cell.get("outputs", []))
        raise KeyError(grade_id)

    def hint(self, student: str, grade_id: str) -> str:
        errors = [o for o in self.outputs(student, grade_id) if o.output_type == "error"]
        return " ".join(str(o.evalue) for o in errors)

    def feedback(self, student: str) -> str:
        path = self.course / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html"
        return path.read_text()

    def scores(self) -> dict[str, float]:
        with open(self.course / "grades.csv", newline="") as f:
            return {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Batch:
    course = make_course(
        tmp_path_factory.mktemp("course"),
        ROOT,
        [ASSIGNMENT],
        sandbox="require",
        timeout_s=TIMEOUT_S,
    )
    run_nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    release = course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    for student, answers in STUDENTS.items():
        nb = submission(answers, base=release)
        nb.cells = [c for c in nb.cells if c.source != DELETE]
        write(nb, course / "submitted" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    log = run_nbgrader(course, "autograde", ASSIGNMENT)
    run_nbgrader(course, "generate_feedback", ASSIGNMENT)
    run_nbgrader(course, "export")
    return Batch(course, log)


def test_every_student_graded(batch: Batch) -> None:
    assert set(batch.scores()) == set(STUDENTS)


@pytest.mark.parametrize("student", sorted(STUDENTS))
def test_score(batch: Batch, student: str) -> None:
    assert batch.scores()[student] == EXPECTED_SCORE[student]


def test_solution_passes_silently(batch: Batch) -> None:
    for name in CHALLENGES:
        assert batch.outputs("solution", name) == []


def test_blank_release_says_what_is_missing(batch: Batch) -> None:
    for name in CHALLENGES:
        assert f"{name} is not defined" in batch.hint("blank", name)


@pytest.mark.parametrize("name", CHALLENGES)
def test_classic_mistake_is_named(batch: Batch, name: str) -> None:
    phrase = CLASSIC_WRONG[name][1]
    assert phrase in batch.hint(f"wrong_{name}", name)
    others = [c for c in CHALLENGES if c != name]
    assert all(batch.outputs(f"wrong_{name}", c) == [] for c in others)


def test_always_equal_refused(batch: Batch) -> None:
    assert "Anything" in batch.hint("always_equal", "bytes_per_token")
    assert "AlwaysEqual" in batch.hint("always_equal", "seats")


@pytest.mark.parametrize("student", ["infinite_loop", "stubborn_loop"])
def test_infinite_loop_costs_one_cell(batch: Batch, student: str) -> None:
    errors = [o for o in batch.outputs(student, "answer_seats") if o.output_type == "error"]
    assert any(o.ename == "CellTimeoutError" for o in errors)
    # cells after the loop still ran: the next answer was graded
    assert batch.outputs(student, "prefill_s") == []


def test_kernel_exit_costs_one_cell(batch: Batch) -> None:
    names = [o.ename for o in batch.outputs("exits_kernel", "answer_seats")]
    assert "DeadKernelError" in names
    assert batch.outputs("exits_kernel", "prefill_s") == []


def test_edited_test_cell_restored(batch: Batch) -> None:
    assert "seats = 1" in batch.hint("edited_test", "seats")
    source = next(
        c.source
        for c in batch.graded("edited_test").cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "seats"
    )
    assert "all good" not in source and "expect(" in source


def test_monkeypatching_grants_nothing(batch: Batch) -> None:
    assert "bytes_per_token = 1 " in batch.hint("monkeypatch", "bytes_per_token")
    assert "seats = 3 " in batch.hint("monkeypatch", "seats")


def test_solutions_invisible_to_student_code(batch: Batch) -> None:
    cell = batch.outputs("reads_solutions", "answer_bytes_per_token")
    printed = "".join(o.get("text", "") for o in cell)
    assert "solution notebooks visible: 0" in printed


def test_test_cells_never_ran_in_kernel(batch: Batch) -> None:
    for student in STUDENTS:
        for cell in batch.graded(student).cells:
            if is_test_cell(cell):
                assert cell.execution_count is None


class TestFeedback:
    RIGHT_VALUES = ("98304", "98,304", "98_304", "0.96", "24 conversations", "seats = 24")

    @pytest.mark.parametrize("student", sorted(STUDENTS))
    def test_no_hidden_test_or_expected_value(self, batch: Batch, student: str) -> None:
        html = batch.feedback(student)
        for secret in ("HIDDEN TESTS", "expect(", "mistakes", "seats_that_fit", "right ="):
            assert secret not in html
        if student != "solution":
            for value in self.RIGHT_VALUES:
                assert value not in html

    def test_feedback_shows_the_hint(self, batch: Batch) -> None:
        assert CLASSIC_WRONG["seats"][1] in batch.feedback("wrong_seats")


def test_repository_course_config() -> None:
    """nbgrader_config.py at the root: the course layout, a timeout, verified tests, no leaks."""
    from nbgrader.preprocessors import ClearHiddenTests, Execute
    from traitlets.config.loader import PyFileConfigLoader

    from kvlib.grading.autograde import VerifiedExecute

    c = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert c.CourseDirectory.root == str(ROOT)
    assert c.CourseDirectory.source_directory == "solutions"
    assert c.CourseDirectory.release_directory == "exercises"
    assert 0 < c.Execute.timeout <= 120
    assert VerifiedExecute in c.Autograde.autograde_preprocessors
    assert Execute not in c.Autograde.autograde_preprocessors
    assert ClearHiddenTests in c.GenerateFeedback.preprocessors
    assert c.SandboxedKernelManager.mode == "require"


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
    match, mismatch, errors = filecmp.cmpfiles(tmp_path, committed_root, fresh, shallow=False)
    assert mismatch == [] and errors == [], "run `make release` and commit exercises/"


def test_exercises_do_not_import_torch() -> None:
    for path in (ROOT / "exercises").rglob("*.ipynb"):
        for cell in read(path).cells:
            assert "torch" not in cell.source, f"{path}: exercises must not import torch"


def test_solution_runs_top_to_bottom_without_torch() -> None:
    """The source notebook, explore cells included (the grader skips those), runs clean."""
    from nbclient import NotebookClient

    nb = read(ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    probe = "import sys\nprint(sorted({'torch', 'transformers'} & set(sys.modules)))"
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    NotebookClient(nb, timeout=120, skip_cells_with_tag="", kernel_name="python3").execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
    explore = [c for c in nb.cells if "skip-execution" in c.metadata.get("tags", [])]
    assert explore and all(c.outputs for c in explore)
    assert nb.cells[-1].outputs[0]["text"].strip() == "[]"
