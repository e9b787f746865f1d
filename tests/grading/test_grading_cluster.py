"""course.apps.cluster: ``make grade ... SCHEDULER=`` on a real Dask cluster on loopback.

A ``dask scheduler`` and two ``dask worker`` processes (one task at a time each,
no nanny: a killed worker stays dead) are started on 127.0.0.1 for this module
and stopped after it. One small class (honest, cheating, flooding and looping
submissions, and one that needs repairing) is graded twice in two copies of
one course: on this machine (``make grade``'s local pool) and on the cluster.
The gradebooks must agree cell by cell, and ``grades.csv`` and the graded
notebooks must be equal. Then a worker is killed in the middle of a batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from grading_support import (
    ASSIGNMENT,
    CHALLENGES,
    NOTEBOOK,
    POINTS,
    RIGHT,
    ROOT,
    TOTAL,
    MiB,
    cell_scores,
    copy_course,
    duplicated_answer,
    grades,
    new_course,
    read,
    submission,
    submitted,
    write,
)

from course.apps.batch import main as make_grade
from course.apps.scratch import make_course
from course.sandbox.limits import Limits

pytestmark = pytest.mark.notebooks

LIMITS = Limits(memory_bytes=512 * MiB, output_bytes=64 * 1024, notebook_s=30)
BIN = Path(sys.executable).parent
LOSE_SEATS = TOTAL - POINTS["seats"]
ALWAYS_EQUAL = (
    "class Anything:\n    def __eq__(self, other):\n        return True\n"
    "bytes_per_token = Anything()"
)


def _students(release: Path) -> dict[str, Any]:
    return {
        "honest": submission(RIGHT, release),
        "cheat": submission({**RIGHT, "answer_bytes_per_token": ALWAYS_EQUAL}, release),
        "flood": submission(
            {**RIGHT, "answer_seats": f"print('x' * 2_000_000)\n{RIGHT['answer_seats']}"}, release
        ),
        "loop": submission({**RIGHT, "answer_seats": "while True:\n    pass"}, release),
        "pasted": duplicated_answer(release),
    }


SCORES = {
    "honest": (TOTAL, ""),
    "cheat": (TOTAL - POINTS["bytes_per_token"], ""),
    "flood": (TOTAL, "output truncated"),
    "loop": (LOSE_SEATS, "did not finish"),
    "pasted": (TOTAL, "appeared 2 times"),
    # An honest notebook beside a link to the solution: set aside on the client, never sent.
    "linked": (TOTAL, "answers.txt is a link or special file: left out of grading"),
    # Right answers submitted after the due date, under a rule that zeroes late work.
    "late": (0.0, ""),
}
DUEDATE = datetime(2026, 3, 1, 12, 0)
LATE_TIMESTAMP = "2026-03-02 12:00:00.000000 UTC"


@dataclass
class Cluster:
    scheduler: str
    workers: list[subprocess.Popen[bytes]]
    process: subprocess.Popen[bytes]  # the scheduler's


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s} s")
        time.sleep(0.2)


@contextlib.contextmanager
def loopback_cluster(folder: Path, workers: int = 2) -> Iterator[Cluster]:
    """A ``dask scheduler`` and ``workers`` workers (one thread, no nanny) on 127.0.0.1,
    logging into ``folder``; stopped (workers first) when the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder / "scheduler.json"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as logs:

        def start(name: str, *argv: str) -> subprocess.Popen[bytes]:
            log = logs.enter_context(open(folder / f"{name}.log", "wb"))
            process = subprocess.Popen([str(BIN / "dask"), *argv], env=env, cwd=folder,
                                       stdout=subprocess.DEVNULL, stderr=log)
            processes.append(process)
            return process

        try:
            start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
                  "--no-dashboard", "--scheduler-file", str(info))
            _wait_for(info.exists, 60, "the scheduler")
            address = json.loads(info.read_text())["address"]
            started = [
                start(f"worker{k}", "worker", address, "--nthreads", "1", "--no-nanny",
                      "--no-dashboard", "--name", f"w{k}", "--host", "127.0.0.1")
                for k in range(workers)
            ]
            from distributed import Client

            with Client(address, timeout=30) as client:
                client.wait_for_workers(workers, timeout=120)
            yield Cluster(address, started, processes[0])
        finally:
            for process in reversed(processes):  # workers first, while the scheduler is up
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("dask")) as started:
        yield started


def _class_course(folder: Path) -> Path:
    from nbgrader.api import Gradebook

    course, release = new_course(folder, timeout_s=3, limits=LIMITS)
    for name, nb in _students(release).items():
        write(nb, submitted(course, name))
    linked = write(submission(RIGHT, release), submitted(course, "linked"))
    (linked.parent / "answers.txt").symlink_to(course / "solutions" / ASSIGNMENT / linked.name)
    late = write(submission(RIGHT, release), submitted(course, "late"))
    (late.parent / "timestamp.txt").write_text(LATE_TIMESTAMP)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.update_or_create_assignment(ASSIGNMENT, duedate=DUEDATE)
    with (course / "nbgrader_config.py").open("a") as config:
        config.write('c.LateSubmissionPlugin.penalty_method = "zero"\n')
    return course


@dataclass
class Runs:
    local: Path
    remote: Path
    status: tuple[int, int]
    output: str


@pytest.fixture(scope="module")
def runs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    folder = tmp_path_factory.mktemp("two_places")
    local = _class_course(folder / "local")
    remote = copy_course(local, folder / "remote")
    here = os.getcwd()
    try:
        status_local = make_grade([ASSIGNMENT, "--jobs", "2", "--course", str(local)])
        status_remote = make_grade([ASSIGNMENT, "--course", str(remote), "--scheduler",
                                    cluster.scheduler])
    finally:
        os.chdir(here)
    log = (remote / ".nbgrader.log").read_text()
    return Runs(local, remote, (status_local, status_remote), log)


def test_both_batches_succeeded(runs: Runs) -> None:
    assert runs.status == (0, 0)


def test_scores_and_flags(runs: Runs) -> None:
    rows = grades(runs.remote)
    for student, (score, flag) in SCORES.items():
        assert float(rows[student]["score"]) == score, (student, rows[student])
        assert flag in rows[student]["flags"] and bool(flag) == bool(rows[student]["flags"])


def test_same_grades_cell_by_cell(runs: Runs) -> None:
    local = cell_scores(runs.local)
    assert len(local) == len(SCORES) * len(CHALLENGES)
    assert cell_scores(runs.remote) == local
    assert grades(runs.remote) == grades(runs.local)


def test_same_graded_notebooks_and_feedback(runs: Runs) -> None:
    def view(course: Path, student: str) -> list[Any]:
        nb = read(course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
        return [(c.cell_type, c.source, c.get("outputs")) for c in nb.cells] + [
            nb.metadata.get("kvlib")
        ]

    def scores_shown(course: Path, student: str) -> list[str]:
        html = (course / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()
        assert "HIDDEN TESTS" not in html
        return re.findall(r"\(Score: [^)]*\)|Late submission penalty", html)

    for student in SCORES:
        assert view(runs.remote, student) == view(runs.local, student), student
        assert scores_shown(runs.remote, student) == scores_shown(runs.local, student), student
    # The late student's page subtracts the penalty on both paths.
    shown = scores_shown(runs.remote, "late")
    assert "Late submission penalty" in shown and f"(Score: 0.0 / {TOTAL:.1f})" in shown


def test_same_graded_folders(runs: Runs) -> None:
    """The same files, with the same permissions, in each student's graded folder; the link
    left out of both; no half-written folder left behind."""
    def listing(course: Path, student: str) -> dict[str, int]:
        folder = course / "autograded" / student / ASSIGNMENT
        return {str(p.relative_to(folder)): p.stat().st_mode for p in folder.rglob("*")}

    for student in SCORES:
        assert listing(runs.remote, student) == listing(runs.local, student), student
    assert "answers.txt" not in listing(runs.remote, "linked")
    assert sorted(p.name for p in (runs.remote / "autograded").iterdir()) == sorted(SCORES)


def test_rerun_grades_only_what_is_missing(runs: Runs, cluster: Cluster,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """As after an interrupted client: graded students are skipped, a missing one graded."""
    shutil.rmtree(runs.remote / "autograded" / "cheat")
    before = grades(runs.remote)
    here = os.getcwd()
    try:
        status = make_grade([ASSIGNMENT, "--course", str(runs.remote), "--scheduler",
                             cluster.scheduler])
    finally:
        os.chdir(here)
    out = capsys.readouterr().out
    assert status == 0 and out.count("up to date") == len(SCORES) - 1
    assert grades(runs.remote) == before


def test_a_task_carries_the_late_penalty_rule_and_due_date(tmp_path: Path) -> None:
    """The settings a worker applies include the late-penalty rule, a plugin class the
    course names (as an import path, with its own section), and the gradebook's due date."""
    from nbgrader.plugins import LateSubmissionPlugin
    from traitlets.config import Config

    from course.apps.cluster import assignment_bundle

    class Halve(LateSubmissionPlugin):
        pass

    config = Config()
    config.AssignLatePenalties.plugin_class = Halve
    config.Halve.penalty_method = "zero"
    config.Execute.timeout = 7
    bundle = assignment_bundle(tmp_path, ASSIGNMENT, config, DUEDATE)
    settings = json.loads(bundle.settings)
    assert settings["AssignLatePenalties"]["plugin_class"].endswith(".Halve")
    assert settings["Halve"] == {"penalty_method": "zero"}
    assert settings["Execute"] == {"timeout": 7}
    assert bundle.duedate == "2026-03-01T12:00:00"
    assert bundle.digest != assignment_bundle(tmp_path, ASSIGNMENT, config).digest


def test_unreachable_scheduler_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    course = make_course(tmp_path / "course", ROOT, [ASSIGNMENT])
    write(submission(RIGHT), submitted(course, "ann"))
    gradebook = course / "gradebook.db"
    had_gradebook = gradebook.exists()  # an empty one, when the course was made with one
    address = "tcp://127.0.0.1:9"  # the discard port: nothing listens there
    assert make_grade([ASSIGNMENT, "--course", str(course), "--scheduler", address]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and address in err and err.startswith("make grade:")
    # Nothing graded or recorded before the cluster answered.
    assert gradebook.exists() == had_gradebook
    if had_gradebook:
        with sqlite3.connect(gradebook) as db:
            assert db.execute("SELECT COUNT(*) FROM student").fetchone() == (0,)
            assert db.execute("SELECT COUNT(*) FROM submitted_assignment").fetchone() == (0,)
    assert not (course / "autograded").exists() and not (course / "grades.csv").exists()


def test_a_worker_killed_mid_batch(cluster: Cluster, tmp_path: Path) -> None:
    """Its task runs on the other worker; every student is graded exactly once."""
    course = _class_course(tmp_path / "course")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    batch = subprocess.Popen(
        [sys.executable, "-m", "course.apps.batch", ASSIGNMENT, "--course", str(course),
         "--scheduler", cluster.scheduler, "--no-feedback"],
        cwd=course, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    from distributed import Client

    with Client(cluster.scheduler, timeout=30) as client:
        _wait_for(lambda: any(client.processing().values()), 120, "a grading task")
        victim = next(w for w in cluster.workers if w.poll() is None)
        victim.kill()
    out, _ = batch.communicate(timeout=600)
    assert batch.returncode == 0, out
    rows = grades(course)
    assert {s: float(r["score"]) for s, r in rows.items()} == {
        s: score for s, (score, _) in SCORES.items()
    }
    with sqlite3.connect(course / "gradebook.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        graded = db.execute("SELECT COUNT(*) FROM submitted_assignment").fetchone()[0]
    assert graded == len(SCORES)
    # Run again: nothing is left to do, nothing is graded twice.
    again = subprocess.run(
        [sys.executable, "-m", "course.apps.batch", ASSIGNMENT, "--course", str(course),
         "--scheduler", cluster.scheduler, "--no-feedback"],
        cwd=course, env=env, capture_output=True, text=True, timeout=600,
    )
    assert again.returncode == 0 and again.stdout.count("up to date") == len(SCORES), again
    assert grades(course) == rows


def guide_commands() -> list[str]:
    """Shell commands of the code blocks of the instructor guide's Dask section."""
    guide = (ROOT / "book" / "instructor_guide.md").read_text()
    section = guide.split("## Grading on a Dask cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_guide_shows_a_cluster_and_make_grade() -> None:
    commands = guide_commands()
    assert commands[-1] == f"make grade ASSIGNMENT={ASSIGNMENT} SCHEDULER=tcp://127.0.0.1:8786"
    assert any(c.startswith(".venv/bin/dask scheduler") for c in commands)
    assert any(c.startswith(".venv/bin/dask worker") for c in commands)


def test_guide_commands_verbatim(tmp_path: Path) -> None:
    """The guide's commands, as written, in a fresh copy of the course with a plain PATH:
    a loopback cluster, and a class graded on it."""
    from test_grading_readme import clone

    course = tmp_path / "course"
    clone(course)
    release = course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    students = {"amara": submission(RIGHT, release),
                "bo": submission({**RIGHT, "answer_seats": "seats = 1"}, release)}
    for name, nb in students.items():
        write(nb, submitted(course, name))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}
    log = tmp_path / "commands.log"
    # A file, not a pipe: the scheduler and workers left running would hold a pipe open.
    with open(log, "wb") as out_file:
        shell = subprocess.Popen(["bash", "-c", "\n".join(guide_commands())], cwd=course,
                                 env=env, stdout=out_file, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            shell.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)  # the scheduler and workers it started
    out = log.read_text()
    assert shell.returncode == 0, out[-3000:]
    assert "on the Dask cluster at tcp://127.0.0.1:8786" in out
    rows = grades(course)
    assert {s: float(r["score"]) for s, r in rows.items()} == {
        "amara": TOTAL, "bo": TOTAL - POINTS["seats"]
    }
    for name in students:
        assert (course / "feedback" / name / ASSIGNMENT / f"{NOTEBOOK}.html").is_file()


def _honest_course(folder: Path, students: tuple[str, ...]) -> Path:
    course, release = new_course(folder, timeout_s=10)
    for name in students:
        write(submission(RIGHT, release), submitted(course, name))
    return course


def _graded_once(course: Path, students: tuple[str, ...]) -> None:
    """Every student once in the gradebook with all its rows, at full marks; grades.csv and
    the graded folders agree."""
    from nbgrader.api import Gradebook

    from course.apps.records import missing_rows

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        subs = gb.find_assignment(ASSIGNMENT).submissions
        assert sorted(s.student.id for s in subs) == sorted(students)
        assert all(missing_rows(s) == [] and s.score == TOTAL for s in subs)
    assert {s: float(r["score"]) for s, r in grades(course).items()} == dict.fromkeys(
        students, TOTAL)
    assert sorted(p.name for p in (course / "autograded").iterdir()) == sorted(students)


def test_the_scheduler_killed_mid_batch(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The scheduler dies while a task runs: ``make grade`` ends with one line saying so;
    with a scheduler back, the rerun grades what was not recorded, each student once."""
    students = ("s1", "s2", "s3")
    course = _honest_course(tmp_path / "course", students)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    with loopback_cluster(tmp_path / "first", workers=1) as first:
        batch = subprocess.Popen(
            [sys.executable, "-m", "course.apps.batch", ASSIGNMENT, "--course", str(course),
             "--scheduler", first.scheduler, "--no-feedback"],
            cwd=course, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert batch.stdout is not None
        seen = ""
        for line in batch.stdout:
            seen += line
            if line.startswith("[1/3]"):
                break
        first.process.kill()
        out, _ = batch.communicate(timeout=600)
    out = seen + out
    assert batch.returncode == 1, out
    gone = [line for line in out.splitlines() if "scheduler" in line and "lost" in line]
    assert len(gone) == 1 and first.scheduler in gone[0], out
    assert "Traceback" not in out
    with loopback_cluster(tmp_path / "second", workers=1) as second:
        capsys.readouterr()
        status = make_grade([ASSIGNMENT, "--course", str(course), "--scheduler",
                             second.scheduler, "--no-feedback"])
    rerun = capsys.readouterr().out
    assert status == 0, rerun
    assert rerun.count("up to date") >= 1  # what the first run recorded is kept
    _graded_once(course, students)
