"""Helpers for the grading tests: chapter 1's notebooks, each student's numbers, submissions.

Chapter 1's challenges draw per-student numbers (``course.checks.numbers``).
:func:`drawn` runs a challenge's own locked numbers cell for a student, so the
tests see exactly what that student's prompt printed; :func:`expected` then
computes the right answers from those numbers with a learner's formulas,
written out here, not taken from kvlib or from the hidden tests.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import fcntl
import io
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import nbformat
from assignments.a01_kv_cache import WRONG

from course.checks import Numbers, grading_student

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = "01_kv_cache"
NOTEBOOK = "kv_cache"
SOURCE = ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
RELEASE = ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
CHALLENGES = ("bytes_per_token", "seats", "prefill_s", "conversation_bytes", "batch_tokens_per_s",
              "cache_tokens")
POINTS = dict.fromkeys(CHALLENGES, 2.0)
TOTAL = sum(POINTS.values())  # a right notebook's score
MiB, GiB = 2**20, 2**30

# Right answers written as a learner would, on the student's numbers N.
RIGHT = {
    "answer_bytes_per_token": "bytes_per_token = 2 * N.layers * N.kv_heads * N.head_dim * 1",
    "answer_seats": "seats = int(N.free_gib * 2**30 / (N.context_tokens * N.kv_bytes_per_token))",
    "answer_prefill_s": "prefill_s = 2 * N.params_billion * 1e9 * N.prompt_tokens / "
    "(N.tflop_per_s * 1e12)",
    "answer_conversation_bytes": "per = 2 * config['num_key_value_heads'] * config['head_dim']"
    " * 2\n"
    "held = [N.context_tokens if t == 'full_attention' else config['sliding_window'] - 1\n"
    "        for t in config['layer_types']]\n"
    "conversation_bytes = per * sum(held)",
    "answer_batch_tokens_per_s": "step_bytes = N.params_billion * 1e9 * N.bytes_per_weight + "
    "N.batch * N.context_tokens * N.kv_bytes_per_token\n"
    "batch_tokens_per_s = N.batch * N.tb_per_s * 1e12 / step_bytes",
    "answer_cache_tokens": "free = int(N.utilization * N.gpu_mib * 2**20) - params_billion * 10**9"
    " * bytes_per_weight // gpus\n"
    "cache_tokens = free // (N.kv_bytes_per_token // gpus)",
}

# The classic wrong answer of each challenge and a phrase of the hint it must get.
CLASSIC_WRONG = WRONG


def read(path: Path) -> Any:
    return nbformat.read(path, as_version=4)


def grade_id(cell: Any) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def cell_source(name: str, path: Path = SOURCE) -> str:
    """The source of the cell with grade id ``name``."""
    return next(c.source for c in read(path).cells if grade_id(c) == name)


def drawn(challenge: str, student: str) -> Numbers:
    """The numbers ``student``'s prompt cell of ``challenge`` draws (the cell itself runs)."""
    namespace: dict[str, Any] = {}
    with grading_student(student), contextlib.redirect_stdout(io.StringIO()):
        exec(cell_source("setup"), namespace)  # the notebook's own imports
        exec(cell_source(f"numbers_{challenge}"), namespace)
    result: Numbers = namespace["N"]
    return result


def expected(student: str) -> dict[str, float]:
    """The right answer of each challenge for ``student``."""
    b, s, p, c, d, t = (drawn(name, student) for name in CHALLENGES)
    _, kv_heads, head_dim, _ = c.attention
    full = c.layers // c.full_every  # layer i is full when (i + 1) % full_every == 0
    held = full * c.context_tokens + (c.layers - full) * min(c.context_tokens, c.window - 1)
    step_bytes = d.params_billion * 1e9 * d.bytes_per_weight + (
        d.batch * d.context_tokens * d.kv_bytes_per_token
    )
    return {
        "bytes_per_token": 2 * b.layers * b.kv_heads * b.head_dim,
        "seats": math.floor(s.free_gib * GiB / (s.context_tokens * s.kv_bytes_per_token)),
        "prefill_s": 2 * p.params_billion * 1e9 * p.prompt_tokens / (p.tflop_per_s * 1e12),
        "conversation_bytes": 2 * kv_heads * head_dim * 2 * held,
        "batch_tokens_per_s": d.batch * d.tb_per_s * 1e12 / step_bytes,
        "cache_tokens": _tp_cache_tokens(t),
    }


def _tp_cache_tokens(t: Numbers) -> int:
    """Tokens a tensor-parallel group caches: each GPU's u x memory less its weight slice,
    over its slice of a token's cache."""
    params_billion, bytes_per_weight, gpus = t.model
    budget = int(t.utilization * t.gpu_mib * 2**20)
    free = budget - params_billion * 10**9 * bytes_per_weight // gpus
    return int(free // (t.kv_bytes_per_token // gpus))


def submission(answers: Mapping[str, str], base: Path = RELEASE) -> Any:
    """The released notebook with the cells whose grade_id is a key replaced."""
    nb = copy.deepcopy(read(base))
    for cell in nb.cells:
        if grade_id(cell) in answers:
            cell.source = answers[str(grade_id(cell))]
    return nb


def write(nb: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def submitted(course: Path, student: str) -> Path:
    """Where ``student``'s notebook of the assignment is submitted in ``course``."""
    return course / "submitted" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb"


def duplicated_answer(release: Path, answer: str = "answer_seats") -> Any:
    """A right notebook whose ``answer`` cell was pasted twice (repaired, flagged)."""
    pasted = submission(RIGHT, release)
    index = [grade_id(c) for c in pasted.cells].index(answer)
    pasted.cells.insert(index, copy.deepcopy(pasted.cells[index]))
    pasted.cells[index]["id"] = "pasted"
    return pasted


def new_course(
    folder: Path, *, timeout_s: int, limits: Any = None, files: Mapping[str, str] | None = None
) -> tuple[Path, Path]:
    """A throwaway course with chapter 1's assignment (and ``files``, by name, added to its
    ``solutions/``) in its gradebook; the course folder and its released notebook."""
    from course.apps.scratch import generate_assignment, make_course

    course = make_course(folder, ROOT, [ASSIGNMENT], timeout_s=timeout_s, limits=limits)
    for name, text in (files or {}).items():
        (course / "solutions" / ASSIGNMENT / name).write_text(text)
    generate_assignment(course, ASSIGNMENT)
    return course, course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"


def copy_course(course: Path, target: Path) -> Path:
    """A copy of ``course`` at ``target`` (links copied as links), its settings moved there."""
    shutil.copytree(course, target, symlinks=True)
    config = (target / "nbgrader_config.py").read_text().replace(str(course), str(target))
    (target / "nbgrader_config.py").write_text(config)
    return target


def cell_scores(course: Path) -> dict[tuple[str, str], tuple[float, float | None]]:
    """Each student's (score, auto score) of each graded cell, from the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {
            (nb.student.id, grade.name): (grade.score, grade.auto_score)
            for submission in gb.find_assignment(ASSIGNMENT).submissions
            for nb in submission.notebooks
            for grade in nb.grades
        }


def grades(course: Path) -> dict[str, dict[str, str]]:
    """``grades.csv`` rows by student id."""
    with open(course / "grades.csv", newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def errors(nb: Any, name: str) -> str:
    """The error messages of the cell with grade id ``name`` in a graded notebook."""
    for cell in nb.cells:
        if grade_id(cell) == name:
            return " ".join(str(o.get("evalue", "")) for o in cell.get("outputs", [])
                            if o.get("output_type") == "error")
    raise KeyError(name)


def built_once(factory: Any, name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``build(folder)`` once per test session, even when pytest-xdist runs the tests of one
    module on several workers (each would otherwise grade the whole batch again).

    The first worker builds under a lock in the session's shared temporary folder; the
    others wait for it and get the same folder and ``build``'s JSON result. Modules that
    need the same class name the same build.
    """
    if name in _BUILT:
        return _BUILT[name]
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = factory.mktemp(name)
        _BUILT[name] = folder, build(folder)
        return _BUILT[name]
    shared = factory.getbasetemp().parent
    folder, result = shared / name, shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            folder.mkdir()
            result.write_text(json.dumps(build(folder)))
    _BUILT[name] = folder, json.loads(result.read_text())
    return _BUILT[name]


_BUILT: dict[str, tuple[Path, Any]] = {}


def _class(release: Path) -> dict[str, Any]:
    """Right, wrong and blank answers, and submissions that need repairing."""
    students = {"right_1": submission(RIGHT, release), "right_2": submission(RIGHT, release),
                "blank": submission({}, release)}
    for name, (wrong, _) in CLASSIC_WRONG.items():
        students[f"wrong_{name}"] = submission({**RIGHT, f"answer_{name}": wrong}, release)
    students["duplicated"] = duplicated_answer(release)
    deleted = submission(RIGHT, release)
    deleted.cells = [c for c in deleted.cells if grade_id(c) != "prefill_s"]
    students["deleted_test"] = deleted
    return students


# The class both ways: scores expected, and a phrase of the flag each student must get.
CLASS = {
    "right_1": (TOTAL, ""), "right_2": (TOTAL, ""), "blank": (0.0, ""),
    **{f"wrong_{name}": (TOTAL - POINTS[name], "") for name in CHALLENGES},
    "duplicated": (TOTAL, "answer_seats appeared 2 times"),
    "deleted_test": (TOTAL, "hidden-test cell prefill_s was deleted: restored"),
    "unreadable": (0.0, "not a readable notebook"),
}


def _grade_twice(folder: Path) -> int:
    from course.apps.batch import main as make_grade
    from course.apps.scratch import run_nbgrader

    serial, release = new_course(folder / "serial", timeout_s=10)
    for name, nb in _class(release).items():
        write(nb, submitted(serial, name))
    submitted(serial, "unreadable").parent.mkdir(parents=True)
    submitted(serial, "unreadable").write_text("{")
    parallel = copy_course(serial, folder / "parallel")
    for step in ("autograde", "generate_feedback"):
        run_nbgrader(serial, step, ASSIGNMENT)
    run_nbgrader(serial, "export")
    return int(make_grade([ASSIGNMENT, "--jobs", "2", "--no-feedback", "--course", str(parallel)]))


def graded_class(factory: Any) -> tuple[Path, Path, int]:
    """One class (:data:`CLASS`) graded twice, shared by the modules that check it: by plain
    ``nbgrader`` commands, one student after another (``serial``: autograde, feedback,
    export), and by ``make grade``'s batch with two workers (``parallel``: no feedback).
    Returns the two course folders and the batch's exit status."""
    folder, status = built_once(factory, "one_class_two_ways", _grade_twice)
    return folder / "serial", folder / "parallel", int(status)
