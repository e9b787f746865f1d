"""``make grade ASSIGNMENT=name``: grade a whole class on every core, then export.

``python -m course.apps.batch ASSIGNMENT [--jobs N] [--force] [--student ID] [--scheduler ADDR]``
run from the course folder:

0. takes the course's grading lock (:mod:`course.apps.runlock`): a second run refuses at
   once, naming the running one, or with ``--wait`` waits for it; then regrades from
   the submission every student a killed or failed run left half-done, and every
   submission changed since it was graded (:mod:`course.apps.records`);
1. puts the assignment into the gradebook when it is missing: nbgrader's
   ``generate_assignment`` reads ``solutions/`` in a scratch folder, so the committed
   ``exercises/`` are never written (they are ``make release``'s; a course with no
   student copy of the assignment gets one, which grading compares submissions with);
2. autogrades every submission under ``submitted/*/ASSIGNMENT/`` with
   ``--jobs`` worker processes (default: one per core). Each worker is
   nbgrader's own ``autograde`` for one student at a time, with the course's
   settings (``nbgrader_config.py``: repair, sandbox, limits, hidden tests
   outside the kernel), so the results are those of a serial
   ``nbgrader autograde ASSIGNMENT``; only the order of work differs;
3. writes each student's feedback (``feedback/``), then ``grades.csv`` with a
   ``flags`` column (:mod:`course.notebooks.flags`).

With ``--scheduler tcp://host:8786`` (or ``$KVLIB_DASK_SCHEDULER``; ``make grade
... SCHEDULER=...``) step 2 runs on that Dask cluster and feedback comes back
from it (:mod:`course.apps.cluster`); this process alone writes the gradebook,
``autograded/``, ``feedback/`` and ``grades.csv``. A scheduler that cannot be
reached is one line naming its address, and exit status 2.

A submission that cannot be graded is reported and skipped; the batch goes on
and the exit status is 1. Stopped (Ctrl-C, SIGTERM), the run ends its workers and
says how far it got; the next run keeps what was graded and regrades the rest.
Each student's nbgrader log is appended to ``.nbgrader.log``. Like ``nbgrader
autograde``, submissions already graded and not resubmitted since are skipped
unless ``--force``.
"""

from __future__ import annotations

import argparse
import copy
import errno
import glob
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course.apps import records
from course.apps.runlock import Busy, grading_lock
from course.apps.scratch import NbgraderError, course_root
from course.notebooks.repair import set_aside

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


# What a worker imports before it grades. Workers are forked from multiprocessing's fork
# server, which imports these once: nbgrader alone takes about 2.4 CPU seconds to import
# (measured on a 2-core machine), once per worker when each started a fresh interpreter.
_WORKER_PRELOAD = ["nbgrader.apps", "course.apps.batch"]


def _worker_context() -> Any:
    """Workers forked from a fork server that has imported ``_WORKER_PRELOAD`` and opened
    nothing else: they share no gradebook connection with this process (``fork`` would
    copy this process's), and none imports nbgrader on its own (``spawn`` would)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_WORKER_PRELOAD)
    return context


def _start_worker(root: str, environ: dict[str, str]) -> None:
    global _API
    from nbgrader.apps import NbGraderAPI

    # The fork server kept the environment of the run that started it: take this run's.
    os.environ.clear()
    os.environ.update(environ)
    # Ctrl-C reaches the whole process group: the parent alone decides, and ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.chdir(root)
    _API = NbGraderAPI(config=_course_config(Path(root)))
    _API.log.setLevel(logging.INFO)


def _prepare(assignment: str) -> str:
    """Put ``assignment`` into the gradebook when it (or its notebooks) is missing.

    nbgrader's ``generate_assignment`` records the assignment, its notebooks and their
    cells (``SaveCells``) and writes the student copies; it runs here on a copy of
    ``solutions/<assignment>`` in a scratch course whose gradebook is the course's, so the
    rows are the same and the committed ``exercises/`` are left alone."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.apps import NbGraderAPI

    with Gradebook(_API.coursedir.db_url, _API.coursedir.course_id) as gb:
        try:
            if gb.find_assignment(assignment).notebooks:
                return ""
        except MissingEntry:
            pass
    root = Path(_API.coursedir.root)
    with tempfile.TemporaryDirectory(prefix="kvlib-prepare-") as scratch:
        shutil.copytree(root / "solutions" / assignment, Path(scratch) / "solutions" / assignment,
                        ignore=shutil.ignore_patterns(*_API.coursedir.ignore))
        config = copy.deepcopy(_API.config)
        config.CourseDirectory.root = scratch
        config.CourseDirectory.db_url = _API.coursedir.db_url
        here = os.getcwd()
        try:
            result = NbGraderAPI(config=config).generate_assignment(
                assignment, force=True, create=True)
        finally:
            os.chdir(here)
        if not result.get("success"):
            raise NbgraderError(
                f"generate_assignment {assignment} failed:\n{result.get('error')}")
        released = root / "exercises" / assignment
        if not released.exists():  # a course with no student copy: grading compares with one
            _move_into_place(Path(scratch) / "exercises" / assignment, released)
            return f"added {assignment} to the gradebook, and its student copy to exercises/"
    return f"added {assignment} to the gradebook (from solutions/; exercises/ left as it is)"


def _move_into_place(folder: Path, target: Path) -> None:
    """``folder`` copied beside ``target`` and renamed to it: whole or not at all, and never
    over an existing ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        shutil.copytree(folder, partial, dirs_exist_ok=True)
        os.rename(partial, target)  # fails, leaving target as it was, if it appeared meanwhile
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _export() -> None:
    """``grades.csv`` in the course folder (the course's export plugin, with flags)."""
    from nbgrader.api import Gradebook

    from course.notebooks.flags import FlaggedCsvExport

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
    root: Path, assignment: str, students: list[str], *, jobs: int, force: bool, feedback: bool,
    regrade: frozenset[str] = frozenset(), graded: list[Outcome] | None = None,
) -> list[Outcome]:
    """Put the assignment in the gradebook if needed, autograde ``students`` with ``jobs``
    workers (those in ``regrade`` even when up to date), give feedback, export
    ``grades.csv``; one line per student on stdout. Returns each autograde, and each
    feedback that failed (appended to ``graded`` as they come, when given)."""
    graded = [] if graded is None else graded
    with ProcessPoolExecutor(jobs, _worker_context(), _start_worker,
                             (str(root), dict(os.environ))) as pool:
        try:
            if message := pool.submit(_prepare, assignment).result():
                print(message, flush=True)
            futures = [pool.submit(_run, "autograde", assignment, s, force or s in regrade)
                       for s in students]
            for number, future in enumerate(as_completed(futures), start=1):
                graded.append(future.result())
                _log(root, "autograde", graded[-1])
                print(f"[{number}/{len(futures)}] {graded[-1].student}: {_state(graded[-1])}",
                      flush=True)
            if feedback:
                graded += _give_feedback(root, pool, assignment, graded, jobs)
            pool.submit(_export).result()
        except BaseException:  # stopped: end the workers now rather than wait for them
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():
                child.terminate()
            raise
    return graded


def grade_class_on_cluster(
    client: Any,
    root: Path,
    assignment: str,
    students: list[str],
    *,
    force: bool,
    feedback: bool,
    regrade: frozenset[str] = frozenset(),
    graded: list[Outcome] | None = None,
) -> list[Outcome]:
    """:func:`grade_class`, with the kernels run on the Dask cluster of ``client``."""
    global _API
    from nbgrader.apps import NbGraderAPI

    here = os.getcwd()
    os.chdir(root)  # nbgrader resolves some paths from the working folder; restored below
    try:
        _API = NbGraderAPI(config=_course_config(root))
        _API.log.setLevel(logging.INFO)
        return _grade_on(client, root, assignment, students, force=force, feedback=feedback,
                         regrade=regrade, graded=[] if graded is None else graded)
    finally:
        os.chdir(here)


def _grade_on(
    client: Any,
    root: Path,
    assignment: str,
    students: list[str],
    *,
    force: bool,
    feedback: bool,
    regrade: frozenset[str],
    graded: list[Outcome],
) -> list[Outcome]:
    """The body of :func:`grade_class_on_cluster`, run from the course folder."""
    from course.apps.cluster import grade_on_cluster

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
        report=report, prepare=prepare, regrade=regrade,
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
    from course.sandbox.kernel import MODE_ENV, bwrap_available

    configured = _course_config(root).SandboxedKernelManager.get("mode", "auto")
    return os.environ.get(MODE_ENV, configured) == "require" and not bwrap_available()


def _ensure_path() -> None:
    """nbgrader runs ``alembic`` from PATH: put this interpreter's scripts first."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def _on_cluster(args: argparse.Namespace, root: Path, students: list[str],
                regrade: frozenset[str], outcomes: list[Outcome]) -> list[Outcome]:
    from course.apps.cluster import connect

    client = connect(args.scheduler)
    try:
        workers = len(client.scheduler_info().get("workers", {}))
        print(f"grading {len(students)} submission(s) of {args.assignment} on the Dask "
              f"cluster at {args.scheduler} ({workers} worker(s))", flush=True)
        grade_class_on_cluster(
            client, root, args.assignment, students, force=args.force,
            feedback=not args.no_feedback, regrade=regrade, graded=outcomes,
        )
        if client.status != "running":  # the scheduler went away: its tasks failed with it
            # Dask logs its own reconnection, given up as the client closes, as a traceback.
            logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
            done = sum(o.success for o in outcomes)
            print(f"make grade: the Dask scheduler at {args.scheduler} was lost mid-batch, "
                  f"with {done} of {len(students)} submission(s) graded and recorded; start "
                  "it and its workers again, then run make grade again: graded work is kept",
                  file=sys.stderr, flush=True)
        return outcomes
    finally:
        client.close()


def _parser() -> argparse.ArgumentParser:
    from course.apps.cluster import SCHEDULER_ENV

    parser = argparse.ArgumentParser(prog="make grade", description=__doc__.splitlines()[0])
    parser.add_argument("assignment", help="an assignment folder of solutions/, e.g. 01_kv_cache")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--force", action="store_true", help="regrade submissions already graded")
    parser.add_argument("--student", action="append", default=[], help="only this student")
    parser.add_argument("--no-feedback", action="store_true", help="skip feedback/")
    parser.add_argument("--course", type=Path, help="course folder (default: found from here)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for a make grade already running on this course")
    parser.add_argument(
        "--scheduler",
        default=os.environ.get(SCHEDULER_ENV) or None,
        help=f"a Dask scheduler, e.g. tcp://host:8786 (default: ${SCHEDULER_ENV}; none: "
        "the cores of this machine)",
    )
    return parser


def _gradebook_exists(url: str) -> bool:
    """Whether there is a gradebook to check (an SQLite file is not made just to look)."""
    return not url.startswith("sqlite:///") or Path(url[len("sqlite:///"):].split("?")[0]).is_file()


def _to_regrade(root: Path, config: Any, assignment: str, students: list[str],
                feedback: bool) -> dict[str, str]:
    """Students to grade again whatever nbgrader's rule says, and why: grading left half-done
    (what was half-written is removed first), or a submission changed since it was graded."""
    from nbgrader.api import Gradebook

    url = config.CourseDirectory.db_url
    found: dict[str, str] = {}
    if _gradebook_exists(url):
        with Gradebook(url, config.CourseDirectory.course_id) as gb:
            found = records.partial(gb, root, assignment, students, feedback=feedback)
            for student in found:
                records.undo(gb, root, assignment, student)
    for student in students:
        graded = records.remembered(root, assignment, student)
        if student not in found and graded and graded != records.digest(root, assignment,
                                                                         student):
            found[student] = "the submission changed since it was graded"
    return found


_NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
_DISK_FULL = (f"make grade: the disk filled up while grading wrote its files ({_NO_SPACE}); "
              "free some space and run make grade again: what was written whole is kept, "
              "the rest is graded then")


def _database_error(err: BaseException) -> bool:
    """An error of the gradebook's database driver (SQLAlchemy's, or psycopg2's for the
    lock), however it reached this process (a worker's error is re-raised here)."""
    return type(err).__module__.split(".")[0] in ("sqlalchemy", "psycopg2")


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


class _Stopped(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stopped


def _grade(args: argparse.Namespace, root: Path, students: list[str],
           regrade: frozenset[str], outcomes: list[Outcome]) -> list[Outcome]:
    if args.scheduler:
        return _on_cluster(args, root, students, regrade, outcomes)
    jobs = min(args.jobs, len(students))
    print(f"grading {len(students)} submission(s) of {args.assignment} with {jobs} worker(s)",
          flush=True)
    return grade_class(
        root, args.assignment, students, jobs=jobs, force=args.force,
        feedback=not args.no_feedback, regrade=regrade, graded=outcomes,
    )


def _grade_until_stable(args: argparse.Namespace, root: Path, students: list[str],
                        regrade: frozenset[str], outcomes: list[Outcome]) -> list[Outcome]:
    """Grade; then grade once more each student whose submission changed while it was being
    graded (what was graded is no longer what was submitted). Each graded submission's
    digest is remembered, so a change after this run is graded by the next."""
    before = {s: records.digest(root, args.assignment, s) for s in students}
    _grade(args, root, students, regrade, outcomes)
    graded = {o.student for o in outcomes if o.success and not o.skipped and o.student in before}
    changed = sorted(s for s in graded if records.digest(root, args.assignment, s) != before[s])
    for student in changed:
        print(f"{student}: the submission changed while it was being graded: graded again "
              "from the new copy", flush=True)
    if changed:
        before.update({s: records.digest(root, args.assignment, s) for s in changed})
        again: list[Outcome] = []
        _grade(args, root, changed, frozenset(changed), again)
        outcomes[:] = [o for o in outcomes if o.student not in changed] + again
    for outcome in outcomes:
        if outcome.success and outcome.student in before:
            records.remember(root, args.assignment, outcome.student, before[outcome.student])
    return outcomes


def main(argv: list[str] | None = None) -> int:
    # Dask itself is imported only when a scheduler is given.
    from course.apps.cluster import SchedulerUnreachable

    parser = _parser()
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
    config = _course_config(root)
    try:
        with grading_lock(root, config.CourseDirectory.db_url, config.CourseDirectory.course_id,
                          wait=args.wait, say=lambda line: print(f"make grade: {line}",
                                                                 flush=True)):
            return _locked(args, root, config, students)
    except Busy as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while it waited for another run, before grading
        print("make grade: stopped before grading began; nothing was written",
              file=sys.stderr)
        return 130
    except SchedulerUnreachable as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # the gradebook's server, asked for the lock, did not answer
        if not _database_error(err):
            raise
        print(f"make grade: the gradebook's database did not answer ({_first_line(err)}); "
              "check that it is running, then run make grade again", file=sys.stderr)
        return 2


def _locked(args: argparse.Namespace, root: Path, config: Any, students: list[str]) -> int:
    """``make grade`` with the course's lock held."""
    for student in students:  # before nbgrader follows a link to who knows where
        for moved in set_aside(root / "submitted" / student / args.assignment):
            print(f"{student}: {moved} is a link or special file: set aside, not graded")
    regrade = _to_regrade(root, config, args.assignment, students, not args.no_feedback)
    for student, why in sorted(regrade.items()):
        print(f"{student}: {why}: graded again from submitted/{student}/{args.assignment}/",
              flush=True)
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _grade_until_stable(args, root, students, frozenset(regrade), outcomes)
    except KeyboardInterrupt as stop:
        name = "SIGTERM" if isinstance(stop, _Stopped) else "Ctrl-C (SIGINT)"
        done = len({o.student for o in outcomes if o.success})
        print(f"make grade: stopped by {name} with {done} of {len(students)} submission(s) "
              f"graded; run it again: graded work is kept, the rest is graded then",
              file=sys.stderr, flush=True)
        return 130 if name.startswith("Ctrl") else 143
    except NbgraderError as err:
        print(f"make grade: {err}", file=sys.stderr)
        return 1
    except BrokenProcessPool:
        print("make grade: a grading worker died (out of memory?); run it again: work already "
              "graded is kept", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(_DISK_FULL, file=sys.stderr)
        return 1
    except Exception as err:
        if not _database_error(err):
            raise
        print(f"make grade: the gradebook's database failed mid-run ({_first_line(err)}); "
              "when it answers again, run make grade again: graded work is kept, the rest "
              "is graded then", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = sorted({o.student for o in outcomes if not o.success})
    print(f"graded {len(students) - len(failed)} of {len(students)} in "
          f"{time.perf_counter() - start:.1f} s; grades.csv written")
    if any(_NO_SPACE in o.error + o.log for o in outcomes if not o.success):
        print(_DISK_FULL, file=sys.stderr)
    if failed:
        print(f"could not grade: {', '.join(failed)} (details in .nbgrader.log; run make grade "
              "again to retry them)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
