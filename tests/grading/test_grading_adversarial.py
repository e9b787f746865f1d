"""Attacks on the autograder, graded in one batch with honest submissions by ``make grade``.

One class (module fixture) mixes honest students with one student per kind of
attack or accident: infinite loops, a dead kernel, memory and fork bombs,
floods of output, a notebook that runs past its time, edited, deleted and
duplicated cells, objects that equal everything, numeric subclasses, a
patched checker and builtins, reading solutions or the gradebook from disk
(directly and through a submitted symbolic link), network calls, writes into
the course folder, attempts to leave the sandbox, forged nbgrader metadata,
a file that is not a notebook and an answer copied from another student.
It is graded by ``course.apps.batch`` (what ``make grade`` runs) with small
limits so that it stays quick. Then: every honest student has full marks,
every cheat scores 0 (or loses only the attacked challenge and is flagged),
the batch finished, and the gradebook and the course's files are intact.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grading_support import (
    ASSIGNMENT,
    CHALLENGES,
    NOTEBOOK,
    POINTS,
    RIGHT,
    TOTAL,
    MiB,
    built_once,
    errors,
    expected,
    grade_id,
    grades,
    new_course,
    read,
    submission,
    write,
)

from course.apps.batch import main as make_grade
from course.sandbox.limits import Limits

pytestmark = pytest.mark.notebooks

LIMITS = Limits(
    memory_bytes=512 * MiB, output_bytes=256 * 1024, notebook_s=20, scratch_bytes=16 * MiB,
    file_bytes=8 * MiB,
)
ALL = set(CHALLENGES)
VERBOSE_CHARS = 20_000_000  # what the verbose student prints before answering
STORED_BYTES = 50_000_000  # the stored output of the stored_* students

LOOP = "while True:\n    pass"
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
    "    try:\n        time.sleep(0.05)\n    except BaseException:\n        pass"
)
SPREAD = (
    "import os, time\nfor i in range(8):\n    if os.fork() == 0:\n"
    "        b = b'x' * (200 * 2**20)\n        time.sleep(60)\n        os._exit(0)\ntime.sleep(60)"
)
STREAM = "import time\nwhile True:\n    print('x' * 10_000)\n    time.sleep(0.001)"
FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
# The released seats cell sets ``seats = ...``; these attacks set seats in an earlier cell,
# so their seats cell keeps nothing that would overwrite it.
KEPT = "pass  # seats was set in the first answer cell"
ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
bytes_per_token = seats = prefill_s = Anything()
"""
SUBCLASS = """
class Sly(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__
    def __sub__(self, other):
        return 0.0
    __rsub__ = __sub__
bytes_per_token, seats, prefill_s = Sly(1), Sly(2), Sly(3)
"""
MONKEYPATCH = """
import builtins, sys, types
import course.checks, kvlib.sizing
course.checks.expect = lambda *args, **kwargs: None
sys.modules["course.checks"] = types.ModuleType("course.checks")
kvlib.sizing.kv_bytes_per_token_dense = lambda *args, **kwargs: 1
builtins.isinstance = lambda *args: True
builtins.type = lambda *args: int
builtins.repr = lambda value: "42"
ip = get_ipython()
ip.set_custom_exc((BaseException,), lambda *args, **kwargs: None)
ip.input_transformers_cleanup.append(lambda lines: ["pass\\n"])
bytes_per_token, seats, prefill_s = 1, 2, 3.0
"""
SNOOP = """
import os
course = os.path.abspath("../../..")
found = [os.path.join(d, f) for d, _, files in os.walk(course) for f in files]
found = [os.path.relpath(p, course) for p in found]
for guess in ["/work/main/solutions", "/work/main/gradebook.db", "/root/.ssh", "/home"]:
    if os.path.isfile(guess) or (os.path.isdir(guess) and os.listdir(guess)):
        found.append(guess)
print("found:", found)
"""
NETWORK = """
import socket
for address in [("1.1.1.1", 53), ("127.0.0.1", 5432), ("10.0.0.1", 80)]:
    try:
        socket.create_connection(address, timeout=1)
        print("connected", address)
    except OSError as err:
        print("refused", address, type(err).__name__)
for path in ["/run/postgresql/.s.PGSQL.5432", "/var/run/docker.sock"]:
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        print("connected", path)
    except OSError as err:
        print("refused", path, type(err).__name__)
"""
WRITE_COURSE = """
import os
for path in ["../../../gradebook.db", "../../../solutions/01_kv_cache/kv_cache.ipynb",
             "../../../grades.csv", "../../../nbgrader_config.py", "kv_cache.ipynb"]:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("wrote", path)
    except OSError as err:
        print("refused", path, type(err).__name__)
"""
ESCAPE = """
import subprocess
for command in ["umount -l /tmp", "mount -o remount,rw /usr", "kill -9 -1",
                "unshare -rm sh -c 'umount -l /work; ls /work'", "chroot / true"]:
    subprocess.run(command, shell=True, capture_output=True)
"""


# Lines only the hidden tests contain (how each computes the right value).
HIDDEN_LINES = ("right = dense(N.layers", "per_seat = N.context_tokens", "seats_that_fit(",
                "right = prefill_rule_of_thumb_s(", "mistakes={")


def _copied(victim: str) -> dict[str, str]:
    values = expected(victim)
    return {f"answer_{c}": f"{c} = {values[c]!r}" for c in CHALLENGES}


@dataclass
class Student:
    answers: dict[str, str]
    score: float
    flag: str = ""  # a phrase of the expected flag ("" = no flag)
    hint: tuple[str, str] = ("", "")  # (grade id, phrase of its error)


def _students() -> dict[str, Student]:
    lose_seats = TOTAL - POINTS["seats"]
    s = {
        "honest_1": Student(RIGHT, TOTAL),
        "honest_2": Student(RIGHT, TOTAL),
        "honest_numpy": Student(
            {
                **RIGHT,
                "answer_seats": "import numpy as np\n"
                "seats = np.int64(N.free_gib * 2**30) // np.int64("
                "N.context_tokens * N.kv_bytes_per_token)",
            },
            TOTAL,
        ),
        "infinite_loop": Student({**RIGHT, "answer_seats": LOOP}, lose_seats, "did not finish"),
        "stubborn_loop": Student({**RIGHT, "answer_seats": STUBBORN}, lose_seats, "did not finish"),
        "kernel_exit": Student(
            {**RIGHT, "answer_seats": "import os\nos._exit(1)"}, lose_seats, "kernel stopped"
        ),
        "memory_bomb": Student({**RIGHT, "answer_seats": "x = bytearray(8 * 2**30)"}, lose_seats),
        "memory_spread": Student({**RIGHT, "answer_seats": SPREAD}, lose_seats, "512 MiB"),
        "fork_bomb": Student({**RIGHT, "answer_seats": FORK_BOMB}, lose_seats, "processes"),
        # A tight loop starves the kernel's output thread: its output piles up inside the
        # kernel until the cell's time runs out or, on a fast machine, the pile outgrows the
        # kernel's memory first and the cell ends in a MemoryError; either way the output
        # that did arrive is cut at the cap and the cell's points are lost.
        "output_flood": Student(
            {**RIGHT, "answer_seats": "while True:\n    print('x' * 10_000)"},
            lose_seats,
            "did not finish within 3 s|output truncated",
        ),
        # Output that streams is counted as it arrives and cut at the limit; the loop itself
        # is stopped by the cell's time limit.
        "output_stream": Student(
            {**RIGHT, "answer_seats": STREAM}, lose_seats, "output truncated&did not finish"
        ),
        # An honest answer after 20 MB of printing: the output is cut, the answer counts.
        "verbose_honest": Student(
            {**RIGHT, "answer_seats": f"print('x' * {VERBOSE_CHARS})\n{RIGHT['answer_seats']}"},
            TOTAL,
            "answer_seats: output truncated",
        ),
        # Stored outputs are not graded (nbgrader clears them): a right notebook saved with
        # a 50 MB printout or a 50 MB figure scores full, flagged; only what is graded
        # (sources, metadata) counts towards the size cap.
        "stored_printout": Student(RIGHT, TOTAL, "outputs dropped"),
        "stored_figure": Student(RIGHT, TOTAL, "outputs dropped"),
        "huge_sources": Student(RIGHT, 0.0, "larger than 32 MiB without its outputs"),
        "cut_off_save": Student(RIGHT, 0.0, "not a readable notebook"),
        "giant_print": Student({**RIGHT, "answer_seats": "print('x' * 300_000_000)"}, lose_seats),
        # Sleeps after the seats test: the challenges after it are never reached.
        "slow_notebook": Student(
            RIGHT, POINTS["bytes_per_token"] + POINTS["seats"], "ran past its 20 s limit"
        ),
        "edited_test": Student(
            {**RIGHT, "answer_seats": "seats = 1", "seats": "pass"},
            lose_seats,
            "was edited",
            ("seats", "seats = 1 "),
        ),
        "deleted_tests": Student(RIGHT, TOTAL, "was deleted: restored"),
        "duplicated_cell": Student(RIGHT, TOTAL, "appeared 2 times"),
        "always_equal": Student(
            {"answer_bytes_per_token": ALWAYS_EQUAL, "answer_seats": KEPT}, 0.0, "",
            ("seats", "Anything")
        ),
        "numeric_subclass": Student(
            {"answer_bytes_per_token": SUBCLASS, "answer_seats": KEPT}, 0.0, "",
            ("seats", "Sly")
        ),
        # A kernel can lie about its values (here repr and type are patched), but never
        # learns the right ones: the grader's own copy of the checks is untouched.
        "monkeypatch": Student(
            {"answer_bytes_per_token": MONKEYPATCH, "answer_seats": KEPT}, 0.0, "",
            ("seats", "seats")
        ),
        "snoop": Student({"answer_bytes_per_token": SNOOP}, 0.0),
        "symlinked_solution": Student(RIGHT, TOTAL, "link or special file"),
        # nbgrader alone fails on a named pipe (and would copy /dev/zero forever through a
        # link): make grade sets such entries aside before nbgrader sees them.
        "named_pipe": Student(RIGHT, TOTAL, "pipe is a link or special file"),
        "network": Student({"answer_bytes_per_token": NETWORK}, 0.0),
        "write_course": Student({"answer_bytes_per_token": WRITE_COURSE}, 0.0),
        "escape": Student({"answer_bytes_per_token": ESCAPE}, 0.0),
        "forged_metadata": Student({"answer_seats": "seats = 3"}, 0.0, "nbgrader settings"),
        "not_a_notebook": Student({}, 0.0, "not a readable notebook"),
        "copied_answers": Student(_copied("honest_1"), 0.0),
    }
    return s


STUDENTS = _students()


def _notebook(name: str, release: Path) -> Any:
    nb = submission(STUDENTS[name].answers, base=release)
    index = {grade_id(c): i for i, c in enumerate(nb.cells)}
    if name == "slow_notebook":
        sleeps = [nbformat.v4.new_code_cell("import time\ntime.sleep(2.8)") for _ in range(8)]
        nb.cells[index["seats"] + 1 : index["seats"] + 1] = sleeps
    elif name == "deleted_tests":
        nb.cells = [c for c in nb.cells if grade_id(c) not in ("bytes_per_token", "seats")]
    elif name == "duplicated_cell":
        pasted = copy.deepcopy(nb.cells[index["answer_seats"]])
        pasted["id"] = "pasted"
        nb.cells.insert(index["answer_seats"] + 1, pasted)
    elif name == "forged_metadata":
        nb.cells[index["answer_seats"]].metadata["nbgrader"].update(grade=True, points=100)
        nb.metadata["kvlib"] = {"flags": []}
    elif name == "stored_printout":
        line = "step 1234: loss 0.5678\n"
        text = line * (STORED_BYTES // len(line))
        printout = nbformat.v4.new_output("stream", name="stdout", text=text)
        nb.cells[index["answer_seats"]].outputs = [printout]
    elif name == "stored_figure":
        png = base64.b64encode(b"\x89PNG" + bytes(STORED_BYTES * 3 // 4)).decode()
        figure = nbformat.v4.new_output("display_data", data={"image/png": png})
        nb.cells[index["answer_seats"]].outputs = [figure]
    elif name == "huge_sources":
        nb.cells.append(nbformat.v4.new_markdown_cell("notes " * (6 * 2**20)))  # 36 MiB
    return nb


def _tree(course: Path) -> dict[str, str]:
    """Hash of every course file the grader must not change."""
    # What grading writes: its outputs, the gradebook, its log, and .grading/ (the run lock
    # and the submission digests, course/apps/runlock.py and course/apps/records.py).
    skip = ("autograded", "feedback", "submitted", "grades.csv", "gradebook.db", ".nbgrader.log",
            ".grading")
    return {
        str(p.relative_to(course)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(course.rglob("*"))
        if p.is_file() and not str(p.relative_to(course)).startswith(skip)
    }


@dataclass
class Batch:
    course: Path
    status: int
    before: dict[str, str]

    def graded(self, student: str) -> Any:
        return read(self.course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")

    def printed(self, student: str, name: str) -> str:
        cell = next(c for c in self.graded(student).cells if grade_id(c) == name)
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _grade_class(folder: Path) -> dict[str, Any]:
    course, release = new_course(folder, timeout_s=3, limits=LIMITS,
                                 files={"data": "released with the assignment\n"})
    for name in STUDENTS:
        submitted = course / "submitted" / name / ASSIGNMENT
        if name == "not_a_notebook":
            submitted.mkdir(parents=True)
            (submitted / f"{NOTEBOOK}.ipynb").write_bytes(b"\x00\xff{not json")
            continue
        write(_notebook(name, release), submitted / f"{NOTEBOOK}.ipynb")
        if name == "cut_off_save":  # the file as a crash mid-save leaves it
            path = submitted / f"{NOTEBOOK}.ipynb"
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        if name == "symlinked_solution":
            target = course / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
            (submitted / "answers.txt").symlink_to(target)
        if name == "named_pipe":
            os.mkfifo(submitted / "pipe")
    before = _tree(course)
    status = make_grade([ASSIGNMENT, "--jobs", "2", "--course", str(course)])
    return {"status": status, "before": before}


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Batch:
    course, result = built_once(tmp_path_factory, "adversarial", _grade_class)
    return Batch(course, result["status"], result["before"])


def test_batch_finished_and_graded_everyone(batch: Batch) -> None:
    assert batch.status == 0
    assert set(grades(batch.course)) == set(STUDENTS)


@pytest.mark.parametrize("name", sorted(STUDENTS))
def test_score_and_flags(batch: Batch, name: str) -> None:
    student, row = STUDENTS[name], grades(batch.course)[name]
    assert float(row["score"]) == student.score
    assert float(row["max_score"]) == TOTAL  # forged points change nothing
    if student.flag:  # phrases: "a|b" one of them, "a&b" both
        for phrases in student.flag.split("&"):
            assert any(p in row["flags"] for p in phrases.split("|")), row["flags"]
    elif name.startswith("honest"):
        assert row["flags"] == ""
    grade_id_, phrase = student.hint
    if grade_id_:
        assert phrase in errors(batch.graded(name), grade_id_)


def test_memory_bomb_is_an_error_in_its_cell(batch: Batch) -> None:
    cell = next(c for c in batch.graded("memory_bomb").cells if grade_id(c) == "answer_seats")
    assert [o.ename for o in cell.outputs if o.output_type == "error"] == ["MemoryError"]


def test_cheats_learn_nothing_from_disk_or_network(batch: Batch) -> None:
    visible = batch.printed("snoop", "answer_bytes_per_token").strip()
    assert visible == "found: ['autograded/snoop/01_kv_cache/data']"  # the released data only
    network = batch.printed("network", "answer_bytes_per_token")
    assert "connected" not in network and network.count("refused") == 5


def test_symlinked_solution_never_reached_the_student(batch: Batch) -> None:
    aside = batch.course / "submitted" / "symlinked_solution" / ".links" / ASSIGNMENT
    assert (aside / "answers.txt").is_symlink()  # moved, link and all: nothing is lost
    for folder in ("autograded", "feedback"):
        assert not (
            batch.course / folder / "symlinked_solution" / ASSIGNMENT / "answers.txt"
        ).exists()


def test_copied_answers_were_right_for_someone_else(batch: Batch) -> None:
    assert grades(batch.course)["honest_1"]["score"] == str(TOTAL)
    mine, theirs = expected("copied_answers"), expected("honest_1")
    assert all(mine[c] != theirs[c] for c in CHALLENGES)


def test_course_files_and_gradebook_intact(batch: Batch) -> None:
    assert _tree(batch.course) == batch.before
    with sqlite3.connect(batch.course / "gradebook.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        students = {row[0] for row in db.execute("SELECT id FROM student")}
        cells = db.execute("SELECT COUNT(*) FROM grade_cells").fetchone()[0]
    assert students == set(STUDENTS) and cells == len(CHALLENGES)


def test_feedback_hides_tests_and_expected_values(batch: Batch) -> None:
    """Feedback shows no hidden test, and nothing the grader wrote holds a right answer."""
    for name in STUDENTS:
        html = (batch.course / "feedback" / name / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()
        assert "HIDDEN TESTS" not in html
        assert not any(line in html for line in HIDDEN_LINES)
        assert ("Notes from the grader" in html) == bool(grades(batch.course)[name]["flags"])
        right = expected(name)
        for cell in batch.graded(name).cells:
            if cell.cell_type != "code" or grade_id(cell) not in CHALLENGES:
                continue  # prompts print the student's own numbers, answers are theirs
            text = " ".join(str(o.get("evalue", "")) for o in cell.outputs)
            for challenge in CHALLENGES:
                value = right[challenge]
                shown = {f"{value:,}", str(value)} if isinstance(value, int) else {f"{value:.3g}"}
                assert not any(re.search(rf"\b{re.escape(v)}\b", text) for v in shown), text
