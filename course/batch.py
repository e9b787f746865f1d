"""``make grade ASSIGNMENT=name``: grade a whole class on every core, then export.

``python -m course.batch ASSIGNMENT [--jobs N] [--force] [--student ID] [--scheduler ADDR]``
run from the course folder:

1. puts the assignment into the gradebook when it is missing (nbgrader's
   ``generate_assignment``, which also rewrites the identical ``exercises/``);
2. autogrades every submission under ``submitted/*/ASSIGNMENT/`` with
   ``--jobs`` worker processes (default: one per core). Each worker is
   nbgrader's own ``autograde`` for one student at a time, with the course's
   settings (``nbgrader_config.py``: repair, sandbox, limits, hidden tests
   outside the kernel), so the results are those of a serial
   ``nbgrader autograde ASSIGNMENT``; only the order of work differs;
3. writes each student's feedback (``feedback/``), then ``grades.csv`` with a
   ``flags`` column (:mod:`course.flags`).

With ``--scheduler tcp://host:8786`` (or ``$KVLIB_DASK_SCHEDULER``; ``make grade
... SCHEDULER=...``) step 2 runs on that Dask cluster and feedback comes back
from it (:mod:`course.cluster`); this process alone writes the gradebook,
``autograded/``, ``feedback/`` and ``grades.csv``. A scheduler that cannot be
reached is one line naming its address, and exit status 2.

A submission that cannot be graded is reported and skipped; the batch goes on
and the exit status is 1. Each student's nbgrader log is appended to
``.nbgrader.log``. Like ``nbgrader autograde``, submissions already graded and
not resubmitted since are skipped unless ``--force``.
"""

from __future__ import annotations

import argparse
import glob
import logging
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course.repair import set_aside
from course.scratch import NbgraderError, course_root

__all__ = [
    "Outcome",
    "grade_class",
    "grade_class_on_cluster",
    "main",
    "submissions",
]

_API: Any = None  # this worker's nbgrader API


@dataclass(frozen=True)
class Outcome:
    """One student's autograde (or feedback) run."""

    student: str
    success: bool
    skipped: bool
    seconds: float
    error: str
    log: str


def submissions(root: Path, assignment: str) -> list[str]:
    """Student ids with a folder ``submitted/<id>/<assignment>/``, sorted."""
    folder = root / "submitted"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / assignment).is_dir())


def _course_config(root: Path) -> Any:
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    url = config.CourseDirectory.get("db_url") or f"sqlite:///{root / 'gradebook.db'}"
    if url.startswith("sqlite:") and "timeout=" not in url:
        # Workers write to one SQLite file: wait for its lock instead of failing.
        url += ("&" if "?" in url else "?") + "timeout=120"
    config.CourseDirectory.db_url = url
    return config


def _start_worker(root: str) -> None:
    global _API
    from nbgrader.apps import NbGraderAPI

    os.chdir(root)
    _API = NbGraderAPI(config=_course_config(Path(root)))
    _API.log.setLevel(logging.INFO)


def _prepare(assignment: str) -> str:
    """Put ``assignment`` into the gradebook when it (or its notebooks) is missing."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(_API.coursedir.db_url) as gb:
        try:
            if gb.find_assignment(assignment).notebooks:
                return ""
        except MissingEntry:
            pass
    result = _API.generate_assignment(assignment, force=True, create=True)
    if not result.get("success"):
        raise NbgraderError(f"generate_assignment {assignment} failed:\n{result.get('error')}")
    return f"added {assignment} to the gradebook (nbgrader generate_assignment)"


def _export() -> None:
    """``grades.csv`` in the course folder (the course's export plugin, with flags)."""
    from nbgrader.api import Gradebook

    from course.flags import FlaggedCsvExport

    with Gradebook(_API.coursedir.db_url) as gb:
        FlaggedCsvExport(parent=_API, to=str(Path(_API.coursedir.root) / "grades.csv")).export(gb)


def _feedback(assignment: str, students: list[str], others: list[str]) -> Outcome:
    """Feedback for ``students`` in one nbgrader run: its HTML templates compile once, not
    once per student (the other students are excluded by name)."""
    from nbgrader.utils import temp_attrs

    start = time.perf_counter()
    with temp_attrs(_API.coursedir, student_id="*", student_id_exclude=",".join(others)):
        result = _API.generate_feedback(assignment, None, force=True)
    return Outcome(
        student="feedback (" + ", ".join(students) + ")",
        success=bool(result.get("success")),
        skipped=False,
        seconds=time.perf_counter() - start,
        error=str(result.get("error") or ""),
        log=str(result.get("log") or ""),
    )


def _run(task: str, assignment: str, student: str, force: bool) -> Outcome:
    start = time.perf_counter()
    escaped = glob.escape(student)  # nbgrader globs the student id
    if task == "autograde":
        result = _API.autograde(assignment, escaped, force=force, create=True)
    else:
        result = _API.generate_feedback(assignment, escaped, force=force)
    log = str(result.get("log") or "")
    return Outcome(
        student=student,
        success=bool(result.get("success")),
        skipped="Skipping existing" in log,
        seconds=time.perf_counter() - start,
        error=str(result.get("error") or ""),
        log=log,
    )


def grade_class(
    root: Path, assignment: str, students: list[str], *, jobs: int, force: bool, feedback: bool
) -> list[Outcome]:
    """Put the assignment in the gradebook if needed, autograde ``students`` with ``jobs``
    workers, give feedback, export ``grades.csv``; one line per student on stdout.
    Returns each autograde, and each feedback that failed."""
    context = multiprocessing.get_context("spawn")  # workers share no gradebook connection
    graded: list[Outcome] = []
    with ProcessPoolExecutor(jobs, context, _start_worker, (str(root),)) as pool:
        if message := pool.submit(_prepare, assignment).result():
            print(message, flush=True)
        futures = [pool.submit(_run, "autograde", assignment, s, force) for s in students]
        for number, future in enumerate(as_completed(futures), start=1):
            graded.append(future.result())
            _log(root, "autograde", graded[-1])
            print(f"[{number}/{len(futures)}] {graded[-1].student}: {_state(graded[-1])}",
                  flush=True)
        if feedback:
            graded += _give_feedback(root, pool, assignment, graded, jobs)
        pool.submit(_export).result()
    return graded


def grade_class_on_cluster(
    client: Any,
    root: Path,
    assignment: str,
    students: list[str],
    *,
    force: bool,
    feedback: bool,
) -> list[Outcome]:
    """:func:`grade_class`, with the kernels run on the Dask cluster of ``client``."""
    global _API
    from nbgrader.apps import NbGraderAPI

    from course.cluster import grade_on_cluster

    os.chdir(root)
    _API = NbGraderAPI(config=_course_config(root))
    _API.log.setLevel(logging.INFO)
    graded: list[Outcome] = []

    def prepare() -> None:  # while the workers grade
        if message := _prepare(assignment):
            print(message, flush=True)

    def report(**fields: Any) -> None:
        graded.append(Outcome(**fields))
        _log(root, "autograde", graded[-1])
        print(f"[{len(graded)}/{len(students)}] {graded[-1].student}: {_state(graded[-1])}",
              flush=True)

    grade_on_cluster(
        client, root, assignment, students, force=force, feedback=feedback, api=_API,
        report=report, prepare=prepare,
    )
    _export()
    return graded


def _give_feedback(
    root: Path, pool: ProcessPoolExecutor, assignment: str, graded: list[Outcome], jobs: int
) -> list[Outcome]:
    """Feedback for every student graded, one share per worker; the runs that failed."""
    ok = sorted(o.student for o in graded if o.success)
    everyone = submissions(root, assignment)
    shares = [ok[k::jobs] for k in range(jobs) if ok[k::jobs]]
    if any("," in s for s in everyone):  # nbgrader's exclusion list is comma-separated
        shares = [[s] for s in ok]
    futures = [
        pool.submit(_feedback, assignment, share, [s for s in everyone if s not in share])
        for share in shares
    ]
    failed = []
    for future in as_completed(futures):
        outcome = future.result()
        _log(root, "feedback", outcome)
        if not outcome.success:
            print(f"feedback failed for some of: {outcome.student}", flush=True)
            failed.append(outcome)
    return failed


def _state(outcome: Outcome) -> str:
    if not outcome.success:
        return "failed"
    return "up to date" if outcome.skipped else f"{outcome.seconds:.1f} s"


def _log(root: Path, task: str, outcome: Outcome) -> None:
    with open(root / ".nbgrader.log", "a", encoding="utf-8") as f:
        f.write(f"==== {task} {outcome.student}\n{outcome.log}{outcome.error}\n")


def _sandbox_missing(root: Path) -> bool:
    """Whether the course requires the sandbox and bubblewrap cannot provide it here."""
    from course.sandbox import MODE_ENV, bwrap_available

    configured = _course_config(root).SandboxedKernelManager.get("mode", "auto")
    return os.environ.get(MODE_ENV, configured) == "require" and not bwrap_available()


def _ensure_path() -> None:
    """nbgrader runs ``alembic`` from PATH: put this interpreter's scripts first."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def _on_cluster(args: argparse.Namespace, root: Path, students: list[str]) -> list[Outcome]:
    from course.cluster import connect

    client = connect(args.scheduler)
    try:
        workers = len(client.scheduler_info().get("workers", {}))
        print(f"grading {len(students)} submission(s) of {args.assignment} on the Dask "
              f"cluster at {args.scheduler} ({workers} worker(s))", flush=True)
        return grade_class_on_cluster(
            client, root, args.assignment, students, force=args.force,
            feedback=not args.no_feedback,
        )
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    # Dask itself is imported only when a scheduler is given.
    from course.cluster import SCHEDULER_ENV, SchedulerUnreachable

    parser = argparse.ArgumentParser(prog="make grade", description=__doc__.splitlines()[0])
    parser.add_argument("assignment", help="an assignment folder of solutions/, e.g. 01_kv_cache")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--force", action="store_true", help="regrade submissions already graded")
    parser.add_argument("--student", action="append", default=[], help="only this student")
    parser.add_argument("--no-feedback", action="store_true", help="skip feedback/")
    parser.add_argument("--course", type=Path, help="course folder (default: found from here)")
    parser.add_argument(
        "--scheduler",
        default=os.environ.get(SCHEDULER_ENV) or None,
        help=f"a Dask scheduler, e.g. tcp://host:8786 (default: ${SCHEDULER_ENV}; none: "
        "the cores of this machine)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        root = course_root(args.course)
    except FileNotFoundError as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 2
    _ensure_path()
    if not (root / "solutions" / args.assignment).is_dir():
        print(f"make grade: no assignment solutions/{args.assignment}", file=sys.stderr)
        return 2
    students = [
        s for s in submissions(root, args.assignment) if s in args.student or not args.student
    ]
    if not students:
        print(f"make grade: nothing under submitted/*/{args.assignment}/", file=sys.stderr)
        return 2
    if _sandbox_missing(root):
        print("make grade: grading needs bubblewrap to confine student code: "
              "apt-get install bubblewrap", file=sys.stderr)
        return 2
    for student in students:  # before nbgrader follows a link to who knows where
        for moved in set_aside(root / "submitted" / student / args.assignment):
            print(f"{student}: {moved} is a link or special file: set aside, not graded")
    start = time.perf_counter()
    try:
        if args.scheduler:
            outcomes = _on_cluster(args, root, students)
        else:
            jobs = min(args.jobs, len(students))
            print(f"grading {len(students)} submission(s) of {args.assignment} "
                  f"with {jobs} worker(s)")
            outcomes = grade_class(
                root, args.assignment, students, jobs=jobs, force=args.force,
                feedback=not args.no_feedback,
            )
    except SchedulerUnreachable as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 2
    except NbgraderError as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 1
    except BrokenProcessPool:
        print("make grade: a grading worker died (out of memory?); run it again: work already "
              "graded is kept", file=sys.stderr)
        return 1
    failed = sorted({o.student for o in outcomes if not o.success})
    print(f"graded {len(students) - len(failed)} of {len(students)} in "
          f"{time.perf_counter() - start:.1f} s; grades.csv written")
    if failed:
        print(f"could not grade: {', '.join(failed)} (details in .nbgrader.log)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
