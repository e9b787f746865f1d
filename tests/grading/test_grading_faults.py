"""``make grade`` through a term's faults, on the real components.

Each fault happens to a real run (the sandbox, nbgrader, SQLite or a real
PostgreSQL server, a real Dask cluster for the cluster's faults in
``test_grading_cluster``): two runs at once, a damaged gradebook record, Ctrl-C
and SIGTERM mid-batch, the disk filling while feedback is written, a
submission changed while it is graded, the database server restarted
mid-batch. After each, and the rerun the instructor is told to make, every
student is graded exactly once: one submission in the gradebook with all its
rows, ``grades.csv`` and each feedback page agreeing with it, and no honest
student below full marks.

One small class (two honest students and one with the classic wrong seats) is
graded once and copied for each test.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from grading_support import (
    ASSIGNMENT,
    CLASSIC_WRONG,
    NOTEBOOK,
    POINTS,
    RIGHT,
    ROOT,
    TOTAL,
    built_once,
    copy_course,
    grades,
    new_course,
    submission,
    submitted,
    write,
)
from postgres_support import postgres_available, postgres_server, restart

from course.apps import records
from course.apps.batch import main as make_grade
from course.apps.scratch import NbgraderError, make_course, run_nbgrader

pytestmark = pytest.mark.notebooks

BIN = Path(sys.executable).parent
SCORES = {"s1": TOTAL, "s2": TOTAL, "s3": TOTAL - POINTS["seats"]}
SLOW_RIGHT = {**RIGHT, "answer_prefill_s": "import time\ntime.sleep(4)\n" + RIGHT[
    "answer_prefill_s"]}


def _class(course: Path, release: Path) -> None:
    write(submission(RIGHT, release), submitted(course, "s1"))
    write(submission(RIGHT, release), submitted(course, "s2"))
    write(submission({**RIGHT, "answer_seats": CLASSIC_WRONG["seats"][0]}, release),
          submitted(course, "s3"))


def _graded(folder: Path) -> int:
    course, release = new_course(folder, timeout_s=10)
    _class(course, release)
    return make_grade([ASSIGNMENT, "--jobs", "2", "--course", str(course)])


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The class, graded once with feedback (not to be changed: tests copy it)."""
    folder, status = built_once(tmp_path_factory, "faults_class", _graded)
    assert status == 0
    return folder


def _copy(graded: Path, tmp_path: Path) -> Path:
    return copy_course(graded, tmp_path / "course")


def _gradebook(course: Path) -> Any:
    from nbgrader.api import Gradebook
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    return Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id)


def graded_once(course: Path, scores: dict[str, float] = SCORES) -> None:
    """Every student graded exactly once and everything the instructor reads agrees."""
    with _gradebook(course) as gb:
        submissions = gb.find_assignment(ASSIGNMENT).submissions
        assert sorted(s.student.id for s in submissions) == sorted(scores)
        for sub in submissions:
            assert records.missing_rows(sub) == [], sub.student.id
            assert sub.score == scores[sub.student.id], sub.student.id
        assert records.partial(gb, course, ASSIGNMENT, sorted(scores), feedback=True) == {}
    assert {s: float(r["score"]) for s, r in grades(course).items()} == scores
    for student, score in scores.items():
        assert (course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb").is_file()
        page = (course / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()
        assert f"{NOTEBOOK} (Score: {score:.1f} / {TOTAL:.1f})" in page, student
        assert records.remembered(course, ASSIGNMENT, student) == records.digest(
            course, ASSIGNMENT, student)


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONUNBUFFERED="1")


def _foreground_job() -> None:
    """In the child, before it runs: Ctrl-C at its default action, as an interactive shell
    starts a foreground job. A shell without job control starts a background command
    with SIGINT ignored, every process under it inherits that, and Python then never
    raises KeyboardInterrupt: a test run started that way would hand it to make grade."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(course: Path, *args: str) -> subprocess.Popen[str]:
    """``make grade`` as its own process group, as a terminal runs it."""
    return subprocess.Popen(
        [sys.executable, "-m", "course.apps.batch", ASSIGNMENT, "--course", str(course), *args],
        cwd=course, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_foreground_job,
    )


def _read_until(process: subprocess.Popen[str], pattern: str) -> str:
    """The output up to and including the first line matching ``pattern``."""
    assert process.stdout is not None
    seen = ""
    for line in process.stdout:
        seen += line
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"{pattern!r} never printed:\n{seen}")


def _finish(process: subprocess.Popen[str], seen: str = "") -> tuple[int, str]:
    out, _ = process.communicate(timeout=600)
    return process.returncode, seen + out


def _rerun(course: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    status = make_grade([ASSIGNMENT, "--jobs", "2", "--course", str(course), *args])
    out = capsys.readouterr()
    assert status == 0, out
    return out.out + out.err


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".venv" not in p.parts}


# ---- two runs at once, on a fresh clone (the reproduction) ------------------------------


def test_two_make_grade_at_once_on_a_fresh_clone(tmp_path: Path) -> None:
    """The instructor's reproduction: ``make grade`` twice, two seconds apart, on a fresh
    clone and gradebook. One grades; the other refuses at once naming it; a third, told
    to wait, waits and finds all graded. No tracked file changes (``exercises/`` above all)."""
    from test_grading_readme import clone

    course = tmp_path / "clone"
    clone(course)
    tracked = _tree(course)
    release = course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    # Each notebook sleeps 4 s, so the first run is still grading when the others start,
    # however fast the machine.
    write(submission(SLOW_RIGHT, release), submitted(course, "s1"))
    write(submission(SLOW_RIGHT, release), submitted(course, "s2"))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}

    def make(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["make", "grade", f"ASSIGNMENT={ASSIGNMENT}", *extra],
                                cwd=course, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    first = make()
    lock = course / ".grading" / "lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text()):  # the first run is grading
        assert time.monotonic() < deadline and first.poll() is None, "the first run never began"
        time.sleep(0.2)
    time.sleep(1)
    second, waiting = make(), make("WAIT=1")
    out2, err2 = second.communicate(timeout=600)
    out1, err1 = first.communicate(timeout=600)
    out3, err3 = waiting.communicate(timeout=600)
    assert first.returncode == 0, out1 + err1
    assert second.returncode == 2, out2 + err2
    refusal = [line for line in err2.splitlines() if line.startswith("make grade:")]
    assert len(refusal) == 1 and "another make grade is grading this course" in refusal[0]
    assert re.search(r"host \S+, pid \d+, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", refusal[0])
    assert "WAIT=1" in refusal[0]
    assert waiting.returncode == 0, out3 + err3
    assert "waiting for the make grade already grading this course" in out3
    assert out3.count("up to date") == 2  # it found the first run's work whole
    assert {s: float(r["score"]) for s, r in grades(course).items()} == {"s1": TOTAL,
                                                                       "s2": TOTAL}
    assert _tree(course).items() >= tracked.items()  # every tracked file as it was
    assert (course / ".grading" / "lock").read_text() == ""  # released


def test_a_killed_runs_lock_is_taken_over(graded: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed (SIGKILL: nothing of it runs again) leaves its lock file naming it; the
    next run says so and takes the lock over."""
    course = _copy(graded, tmp_path)
    run = _start(course, "--force", "--jobs", "1")
    _read_until(run, r"^\[1/3\]")
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert f"pid {run.pid}," in (course / ".grading" / "lock").read_text()
    out = _rerun(course, capsys)
    assert re.search(rf"a make grade that did not finish \(host \S+, pid {run.pid}, since "
                     r"[^)]+\) left its lock: taken over", out)
    graded_once(course)


def test_postgres_advisory_lock_names_the_holder(tmp_path: Path) -> None:
    """Against a shared PostgreSQL gradebook a run from another machine (another course
    folder: its file lock is elsewhere) is refused by the server's advisory lock."""
    from course.apps.runlock import Busy, grading_lock

    assert postgres_available(), "install Debian's PostgreSQL: apt-get install postgresql"
    with postgres_server() as url:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with grading_lock(tmp_path / "a", url, "course-x") as holder:
            with pytest.raises(Busy) as refused, grading_lock(tmp_path / "b", url, "course-x"):
                pass
            message = str(refused.value)
            assert f"make grade {holder.host[:24]} pid {holder.pid}" in message
            assert "gradebook" in message and "WAIT=1" in message
            with grading_lock(tmp_path / "b", url, "another-course"):
                pass  # another course's runs are not held up
        with grading_lock(tmp_path / "b", url, "course-x"):
            pass  # free once the holder ends


# ---- a damaged record, as the race left it --------------------------------------------


def _drop_comment(course: Path, student: str, cell: str) -> None:
    with _gradebook(course) as gb:
        gb.db.delete(gb.find_comment(cell, NOTEBOOK, ASSIGNMENT, student))
        gb.db.commit()


def test_damaged_records_are_regraded(graded: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The race's damage (a submission missing a comment row: nbgrader's "MissingEntry: No
    such comment", on every run, ``--force`` too), a graded folder whose records are gone,
    records whose graded folder is gone: each found by ``make grade`` and regraded."""
    course = _copy(graded, tmp_path)
    _drop_comment(course, "s1", "answer_bytes_per_token")
    with pytest.raises(NbgraderError, match="MissingEntry"):  # plain nbgrader cannot recover
        run_nbgrader(course, "autograde", ASSIGNMENT, "--student", "s1", "--force")
    with _gradebook(course) as gb:
        gb.remove_submission(ASSIGNMENT, "s2")
    import shutil

    shutil.rmtree(course / "autograded" / "s3")
    out = _rerun(course, capsys)
    assert ("s1: gradebook records partial (no comment kv_cache/answer_bytes_per_token): "
            f"graded again from submitted/s1/{ASSIGNMENT}/") in out
    assert "s2: a graded folder without gradebook records: graded again" in out
    assert "s3: gradebook records without a graded folder: graded again" in out
    graded_once(course)
    # FORCE=1 on a damaged record succeeds too.
    _drop_comment(course, "s2", "answer_seats")
    out = _rerun(course, capsys, "--force", "--student", "s2")
    assert "s2: gradebook records partial (no comment kv_cache/answer_seats)" in out
    graded_once(course)


# ---- stopped mid-batch ------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "name", "status"), [
    (signal.SIGINT, "Ctrl-C (SIGINT)", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_stopped_mid_batch_then_run_again(graded: Path, tmp_path: Path, sig: int, name: str,
                                          status: int,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C reaches the whole process group (as a terminal sends it); SIGTERM the run
    alone (as a scheduler or ``kill`` sends it). The run ends its workers, says how far it
    got; the rerun keeps that and grades the rest."""
    course = _copy(graded, tmp_path)
    # The second student's notebook sleeps 4 s, so the stop lands while it is graded however
    # fast the machine grades the others.
    release = course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    write(submission(SLOW_RIGHT, release), submitted(course, "s2"))
    run = _start(course, "--force", "--jobs", "1")
    seen = _read_until(run, r"^\[1/3\]")
    time.sleep(1)  # the second student's kernel is starting or running
    if sig == signal.SIGINT:
        os.killpg(run.pid, sig)
    else:
        run.send_signal(sig)
    code, out = _finish(run, seen)
    assert code == status, out
    assert re.search(rf"make grade: stopped by {re.escape(name)} with 1 of 3 submission\(s\) "
                     r"graded; run it again", out), out
    assert "Traceback" not in out
    assert (course / ".grading" / "lock").read_text() == ""
    again = _rerun(course, capsys)
    assert again.count("up to date") >= 1  # the student graded before the stop is kept
    graded_once(course)


# ---- the disk fills while feedback is written ---------------------------------------------


def test_disk_full_while_feedback_is_written(graded: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``feedback/`` on a 256 KiB tmpfs the test mounts: one page (about 190 KB) fits, the
    next does not. The run says the disk filled; freed, the rerun writes what is missing."""
    course = _copy(graded, tmp_path)
    feedback = course / "feedback"
    import shutil

    shutil.rmtree(feedback)
    feedback.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(feedback)],
                   check=True)
    try:
        capsys.readouterr()
        code = make_grade([ASSIGNMENT, "--jobs", "2", "--force", "--course", str(course)])
        out = capsys.readouterr()
        assert code == 1, out
        full = [line for line in out.err.splitlines() if "the disk filled up" in line]
        assert len(full) == 1 and "No space left on device" in full[0], out
        assert "Traceback" not in out.out + out.err
        subprocess.run(["mount", "-o", "remount,size=4m", str(feedback)], check=True)  # freed
        again = _rerun(course, capsys)
        assert "its feedback was never written: graded again" in again
        graded_once(course)
    finally:
        subprocess.run(["umount", str(feedback)], check=True)


# ---- a submission changed while it is graded --------------------------------------------


def test_submission_changed_while_graded(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """s2 replaces a wrong answer by the right one while its first copy is being graded
    (its answer sleeps 4 s): graded again from the new copy in the same run; a change
    after the run is graded by the next one, whatever its timestamp."""
    course, release = new_course(tmp_path / "course", timeout_s=10)
    write(submission(RIGHT, release), submitted(course, "s1"))
    wrong = {**SLOW_RIGHT, "answer_seats": CLASSIC_WRONG["seats"][0]}
    write(submission(wrong, release), submitted(course, "s2"))
    run = _start(course, "--jobs", "1")
    seen = _read_until(run, r"^\[1/2\] s1")
    time.sleep(1)
    write(submission(SLOW_RIGHT, release), submitted(course, "s2"))
    code, out = _finish(run, seen)
    assert code == 0, out
    assert ("s2: the submission changed while it was being graded: graded again from the "
            "new copy") in out
    scores = {"s1": TOTAL, "s2": TOTAL}
    graded_once(course, scores)
    write(submission(wrong, release), submitted(course, "s2"))  # after the run
    out = _rerun(course, capsys)
    assert "s2: the submission changed since it was graded: graded again" in out
    graded_once(course, {"s1": TOTAL, "s2": TOTAL - POINTS["seats"]})


# ---- the PostgreSQL server restarted mid-batch -------------------------------------------


def test_postgres_restarted_mid_batch(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The gradebook's server restarts (every connection cut) while the second of three
    students is graded: that student fails, named in one line with how to retry; the rerun
    regrades what the cut left partial."""
    assert postgres_available(), "install Debian's PostgreSQL: apt-get install postgresql"
    with postgres_server() as url:
        course = make_course(tmp_path / "course", ROOT, [ASSIGNMENT], timeout_s=10, db_url=url)
        release = ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
        _class(course, release)
        write(submission(SLOW_RIGHT, release), submitted(course, "s2"))
        run = _start(course, "--jobs", "1")
        seen = _read_until(run, r"^\[1/3\]")
        time.sleep(1)
        restart(url)
        code, out = _finish(run, seen)
        assert "Traceback" not in out
        # Either no write was under way when the connections were cut, or what was cut is
        # said in one line, with what to do.
        assert code == 0 or re.search(
            r"could not grade: .*run make grade again to retry them|the gradebook's database "
            r"failed mid-run \(OperationalError: .*\); when it answers again, run make grade "
            r"again", out), out
        assert "the gradebook's server cut this run's lock connection during the run" in out
        again = _rerun(course, capsys)
        assert "could not grade" not in again
        graded_once(course)


def test_gradebook_server_down_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A PostgreSQL gradebook whose server is not there: one line, nothing graded."""
    url = "postgresql://grader@127.0.0.1:9/course"  # the discard port: nothing listens
    course = make_course(tmp_path / "course", ROOT, [ASSIGNMENT], db_url=url)
    release = ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    write(submission(RIGHT, release), submitted(course, "s1"))
    assert make_grade([ASSIGNMENT, "--course", str(course)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("make grade: the gradebook's database did not answer "
                          "(OperationalError: ") and "run make grade again" in err
    assert not (course / "autograded").exists()
