"""``make grade ... SCHEDULER=tcp://host:8786``: the same grading, kernels run on Dask.

The work splits where the state is:

- a **worker** (:func:`grade_remotely`) gets bytes, never paths: one
  student's submitted files (and the names of the links set aside from them),
  and the assignment (its ``solutions/`` and ``exercises/`` files, the
  course's grading settings and late-penalty rule, and its due date in the
  course's gradebook, sent once to each worker). In one scratch course
  per assignment, made on first use and kept, it runs nbgrader's
  ``autograde`` and ``generate_feedback`` with the course's settings (sandbox,
  limits, repair, hidden tests outside the kernel) and returns the graded
  folder and the feedback files (the feedback page's templates compile once
  per worker process, not once per student). It needs no shared file system
  and never sees the course's gradebook. A worker's first task turns off its
  sampling profiler (:func:`_without_profiler`).
- the **client** (:func:`grade_on_cluster`, in ``make grade``) alone writes
  the course. It sends every task first, then puts the assignment in the
  gradebook when it is missing, while the workers grade. For each result it
  records, in one gradebook connection (SQLite,
  or ``$KVLIB_GRADEBOOK_URL``) and one transaction, what nbgrader's ``autograde`` records: the
  student and the submission with its timestamp, zero for a notebook not
  submitted, then each graded notebook's scores by nbgrader's own
  ``SaveAutoGrades`` (read from the graded notebook's outputs), its late
  penalty by ``AssignLatePenalties`` and its flags; then it puts the graded
  folder in ``autograded/`` and the feedback in ``feedback/``, and at the end
  writes ``grades.csv``. The worker ran the same code as one machine does on
  the same bytes, so the scores are the same cell by cell; no notebook is read,
  repaired or converted twice.

A worker that dies mid-task: the scheduler runs its tasks elsewhere, and the
client writes only whole results (a graded folder appears by one rename,
after its gradebook rows), so every student is graded once. A client
interrupted: what it wrote is graded work, skipped on the next run (as
``nbgrader autograde`` skips it) unless ``--force``.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from nbconvert.exporters import HTMLExporter

__all__ = [
    "SCHEDULER_ENV",
    "Assignment",
    "Graded",
    "Recorder",
    "SchedulerUnreachable",
    "TemplateCachingHTMLExporter",
    "assignment_bundle",
    "connect",
    "gradebook_duedate",
    "grade_on_cluster",
    "grade_remotely",
    "results",
    "submit",
]

SCHEDULER_ENV = "KVLIB_DASK_SCHEDULER"
# Sections of the course's nbgrader settings a worker must apply as the course does: how
# it runs a notebook, and the late-penalty rule the feedback page's score applies (with
# the section of a plugin class the course names in AssignLatePenalties.plugin_class).
_SETTINGS = (
    "Execute", "VerifiedExecute", "SandboxedKernelManager", "AssignLatePenalties",
    "LateSubmissionPlugin",
)
# A scheduler answers a connection on loopback or a LAN in milliseconds; a busy one that
# was started a moment ago, within a few seconds. Past this, it is not there.
CONNECT_TIMEOUT_S = 5


class SchedulerUnreachable(RuntimeError):
    """No Dask scheduler answered at the address given."""


@dataclass(frozen=True)
class Assignment:
    """What every task of one assignment shares: files by path relative to the assignment's
    folder, the course's grading settings (nbgrader config sections, as JSON) and the
    assignment's due date in the course's gradebook (ISO 8601, UTC; "" when it has none)."""

    name: str
    source: dict[str, bytes]
    release: dict[str, bytes]
    settings: str
    duedate: str = ""

    @property
    def digest(self) -> str:
        """Names a worker's scratch course: the same assignment, the same folder."""
        h = hashlib.sha256(f"{self.name}\0{self.settings}\0{self.duedate}".encode())
        for files in (self.source, self.release):
            for path in sorted(files):
                h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class Graded:
    """What a worker sends back for one student."""

    student: str
    success: bool
    log: str
    error: str = ""
    graded: dict[str, bytes] = field(default_factory=dict)  # the autograded folder's files
    modes: dict[str, int] = field(default_factory=dict)  # their permission bits
    feedback: dict[str, bytes] = field(default_factory=dict)  # relative path -> file
    worker_s: float = 0.0
    worker_cpu_s: float = 0.0

    @property
    def notebooks(self) -> dict[str, bytes]:
        """The graded notebooks at the top of the folder, by file name."""
        return {p: data for p, data in self.graded.items()
                if p.endswith(".ipynb") and "/" not in p}


def _files(folder: Path, ignore: tuple[str, ...] = (".ipynb_checkpoints", "__pycache__")) -> dict[
    str, bytes
]:
    """Every regular file below ``folder`` (links and special files are not sent)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if any(part in ignore for part in path.relative_to(folder).parts):
            continue
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(folder))] = path.read_bytes()
    return found


def _setting(value: Any) -> Any:
    """A setting as JSON holds it: a class (e.g. a late-penalty plugin) by its import path,
    which traitlets reads back as the class."""
    return f"{value.__module__}.{value.__qualname__}" if isinstance(value, type) else value


def _sections(config: Any) -> list[str]:
    """:data:`_SETTINGS`, and the section of the late-penalty plugin class the course names."""
    plugin = config["AssignLatePenalties"].get("plugin_class") if (
        "AssignLatePenalties" in config) else None
    named = [str(_setting(plugin)).rsplit(".", 1)[-1]] if plugin else []
    return [*_SETTINGS, *named]


def assignment_bundle(
    root: Path, assignment: str, config: Any, duedate: datetime | None = None
) -> Assignment:
    """The assignment's files and the course's grading settings, from the course ``root``;
    ``duedate`` as the course's gradebook holds it (naive, UTC)."""
    settings = {
        name: {k: _setting(v) for k, v in config[name].items() if k != "course_root"}
        for name in _sections(config)
        if name in config
    }
    return Assignment(
        name=assignment,
        source=_files(root / "solutions" / assignment),
        release=_files(root / "exercises" / assignment),
        settings=json.dumps(settings, sort_keys=True),
        duedate=duedate.isoformat() if duedate else "",
    )


def gradebook_duedate(api: Any, assignment: str) -> datetime | None:
    """``assignment``'s due date in the course's gradebook; None when it has none yet."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        try:
            duedate: datetime | None = gb.find_assignment(assignment).duedate
        except MissingEntry:
            return None
    return duedate


# ---- the worker side -------------------------------------------------------------------


class _TemplateBytecode(jinja2.BytecodeCache):
    """Compiled Jinja templates kept in this process, keyed by name and source checksum."""

    def __init__(self) -> None:
        self._compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if bucket.key in self._compiled:
            bucket.bytecode_from_string(self._compiled[bucket.key])

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._compiled[bucket.key] = bucket.bytecode_to_string()


_TEMPLATES = _TemplateBytecode()


class TemplateCachingHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter whose templates compile once per process, not once per
    feedback run: nbgrader makes a new exporter for every ``generate_feedback``, and a worker
    runs one per student. Jinja still reads each template's source and recompiles it when
    the source changed (the cache key holds its checksum); the pages are the same."""

    def _create_environment(self) -> jinja2.Environment:
        environment: jinja2.Environment = super()._create_environment()  # type: ignore[no-untyped-call]
        environment.bytecode_cache = _TEMPLATES
        return environment


_SCRATCH_CONFIG = '''"""A worker's scratch course: the course's settings, its own gradebook."""

import json

from traitlets.config import Config

from course.apps.autograde import configure
from course.apps.cluster import TemplateCachingHTMLExporter

c = get_config()  # noqa: F821
configure(c, {root!r}, db_url={db_url!r})
c.merge(Config(json.loads({settings!r})))
c.SandboxedKernelManager.course_root = {root!r}
c.GenerateFeedback.exporter_class = TemplateCachingHTMLExporter
'''
_SCRATCH: dict[str, tuple[Path, Any]] = {}  # digest -> (course folder, nbgrader API)
# One student at a time per worker process, whatever its --nthreads: grading changes the
# working folder and the environment (the student id the sandbox reads).
_ONE_AT_A_TIME = threading.Lock()


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = folder / relative
        if not path.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"a file outside its folder: {relative!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _without_profiler() -> None:
    """Stop the running Dask worker's sampling profiler (nothing outside a worker).

    A worker samples the stack of each running task every 10 ms for its dashboard's profile
    page: a grading task's stack (nbgrader, nbconvert, traitlets, the kernel client) is deep,
    and walking it cost about a fifth of the worker's CPU time. The rest of the worker, its
    dashboard included, is left as it is."""
    try:
        from distributed import get_worker

        callbacks = get_worker().periodic_callbacks
    except (ImportError, ValueError):
        return
    for name in ("profile", "profile-cycle"):
        callback = callbacks.pop(name, None)
        if callback is not None:
            callback.stop()


def _worker_folder() -> str | None:
    """The running Dask worker's own folder: Dask removes it when the worker stops, and a
    worker started later on the machine removes one a killed worker left. None outside a
    worker (the system's temporary folder is used)."""
    try:
        from distributed import get_worker

        folder: str = get_worker().local_directory
        return folder
    except (ImportError, ValueError):
        return None


def _scratch(assignment: Assignment) -> tuple[Path, Any]:
    """This worker process's course for ``assignment``, made (and the assignment put in its
    gradebook) on first use, then kept for every student of the assignment."""
    if assignment.digest in _SCRATCH:
        return _SCRATCH[assignment.digest]
    from course.apps.scratch import nbgrader_api, scripts_on_path

    root = Path(tempfile.mkdtemp(prefix=f"kvlib-worker-{assignment.digest}-",
                                 dir=_worker_folder()))
    atexit.register(shutil.rmtree, root, True)  # when the process ends (ignoring errors)
    _write(root / "solutions" / assignment.name, assignment.source)
    _write(root / "exercises" / assignment.name, assignment.release)
    (root / "nbgrader_config.py").write_text(_SCRATCH_CONFIG.format(
        root=str(root), db_url=f"sqlite:///{root / 'gradebook.db'}", settings=assignment.settings
    ))
    os.chdir(root)  # nbgrader resolves some paths from the working folder
    with scripts_on_path():
        api = nbgrader_api(root)
        result = api.generate_assignment(assignment.name, force=True, create=True)
    if not result.get("success"):
        raise RuntimeError(f"generate_assignment failed on a worker:\n{result.get('error')}")
    if assignment.duedate:  # the late penalty the feedback page subtracts depends on it
        from nbgrader.api import Gradebook

        with Gradebook(api.coursedir.db_url) as gb:
            gb.update_or_create_assignment(
                assignment.name, duedate=datetime.fromisoformat(assignment.duedate))
    _SCRATCH[assignment.digest] = root, api
    return root, api


def grade_remotely(
    assignment: Assignment,
    student: str,
    submitted: dict[str, bytes],
    feedback: bool = True,
    set_aside: tuple[str, ...] = (),
) -> Graded:
    """Autograde one student (and give feedback) in this worker's scratch course.

    ``set_aside``: the paths of the submission that were links or special files on the
    client (never sent): they are flagged here as there (:mod:`course.notebooks.intake`).
    """
    _without_profiler()
    with _ONE_AT_A_TIME:
        return _grade_here(assignment, student, submitted, feedback, set_aside)


def _stand_ins(folder: Path, relatives: tuple[str, ...]) -> None:
    """A dangling link for each path in ``folder`` (the scratch course's ``.links``): what the
    repairing reader looks for, pointing nowhere."""
    for relative in relatives:
        link = folder / relative
        if not link.parent.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"a set-aside path outside its folder: {relative!r}")
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("set-aside-on-the-grading-client", link)


def _grade_here(
    assignment: Assignment, student: str, submitted: dict[str, bytes], feedback: bool,
    set_aside: tuple[str, ...],
) -> Graded:
    from course.apps.scratch import scripts_on_path
    from course.notebooks.repair import SET_ASIDE

    start, cpu = time.perf_counter(), time.process_time()
    root, api = _scratch(assignment)
    os.chdir(root)
    for folder in ("submitted", "autograded", "feedback"):
        shutil.rmtree(root / folder / student, ignore_errors=True)
    _write(root / "submitted" / student / assignment.name, submitted)
    _stand_ins(root / "submitted" / student / SET_ASIDE / assignment.name, set_aside)
    escaped = glob.escape(student)  # nbgrader globs the student id
    with scripts_on_path():
        graded = api.autograde(assignment.name, escaped, force=True, create=True)
        log = str(graded.get("log") or "")
        given: dict[str, Any] = {"success": not feedback}
        if graded.get("success") and feedback:
            given = api.generate_feedback(assignment.name, escaped, force=True)
            log += str(given.get("log") or "")
    out = root / "autograded" / student / assignment.name
    files = _files(out, ignore=())
    return Graded(
        student=student,
        success=bool(graded.get("success")) and bool(given.get("success")),
        log=log,
        error=str(graded.get("error") or given.get("error") or ""),
        graded=files,
        modes={p: (out / p).stat().st_mode & 0o7777 for p in files},
        feedback=_files(root / "feedback" / student / assignment.name),
        worker_s=time.perf_counter() - start,
        worker_cpu_s=time.process_time() - cpu,
    )


# ---- the client side -------------------------------------------------------------------


def connect(address: str) -> Any:
    """A Dask client on the scheduler at ``address``, or :class:`SchedulerUnreachable`."""
    from distributed import Client

    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError, ValueError) as err:
        raise SchedulerUnreachable(
            f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S} s "
            f"({type(err).__name__}); start one (dask scheduler) or check the address"
        ) from None


def up_to_date(coursedir: Any, assignment: str, student: str, notebooks: list[str]) -> bool:
    """Whether ``student``'s graded copy is complete and not older than the submission
    (nbgrader autograde's own rule for skipping a student)."""
    src = coursedir.format_path(coursedir.submitted_directory, student, assignment)
    dest = coursedir.format_path(coursedir.autograded_directory, student, assignment)
    if not all(os.path.isfile(os.path.join(dest, n)) for n in notebooks):
        return False
    new, old = coursedir.get_existing_timestamp(src), coursedir.get_existing_timestamp(dest)
    return not (new is not None and old is not None and new > old)


@dataclass(frozen=True)
class Task:
    """One student's share of the work: the files sent, and the paths set aside."""

    files: dict[str, bytes]
    set_aside: tuple[str, ...]


def task_of(root: Path, assignment: str, student: str) -> Task:
    """What is sent for ``student``: the submission's regular files, and the names of its
    links and special files (still in place, or set aside by ``make grade``)."""
    from course.notebooks.repair import SET_ASIDE, unsafe_files

    folder = root / "submitted" / student / assignment
    aside = folder.parent / SET_ASIDE / assignment
    names = {str(p) for p in unsafe_files(folder)} | {str(p) for p in unsafe_files(aside)}
    return Task(_files(folder), tuple(sorted(names)))


def submit(
    client: Any, assignment: Assignment, tasks: dict[str, Task], feedback: bool
) -> dict[Any, str]:
    """Send every submission to the cluster; the futures, by student. The workers start at
    once, while this process goes on (the assignment is sent to each worker once)."""
    shared = client.scatter(assignment, broadcast=True)
    batch = uuid.uuid4().hex[:8]
    return {
        client.submit(grade_remotely, shared, student, task.files, feedback, task.set_aside,
                      pure=False, key=f"grade-{assignment.name}-{student}-{batch}"): student
        for student, task in tasks.items()
    }


def results(client: Any, futures: dict[Any, str]) -> Iterator[Graded]:
    """The results of :func:`submit`'s futures, as they complete. A task whose worker died is
    run again elsewhere by the scheduler; one that raised is a failed result."""
    from distributed import as_completed

    for future in as_completed(futures, loop=client.loop):  # type: ignore[no-untyped-call]
        try:
            yield future.result()
        except Exception as err:  # the task raised on its worker, or lost too many workers
            yield Graded(futures[future], False, "", f"{type(err).__name__}: {err}")
        finally:
            future.release()  # the result's bytes are not kept on the cluster once read


def _replace_folder(folder: Path, files: dict[str, bytes], modes: dict[str, int]) -> None:
    """``folder`` holding exactly ``files``: written beside it, then renamed into place, so a
    reader (or a rerun after a crash) sees the old folder or the whole new one."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    partial.mkdir()  # the umask's mode, as nbgrader's own folders
    try:
        _write(partial, files)
        for relative, mode in modes.items():
            os.chmod(partial / relative, mode)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


class _OneTransaction:
    """A gradebook session whose ``commit`` only flushes: nbgrader's gradebook methods and
    ``SaveAutoGrades`` commit after each row, and a result's rows are then committed together
    by :meth:`Recorder.record` (one disk sync, not one a cell, and no half-written student). A
    ``rollback`` (nbgrader's, on a database error) rolls back the whole result."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.rolled_back = False

    def commit(self) -> None:
        self._session.flush()

    def rollback(self) -> None:
        self._session.rollback()
        self.rolled_back = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class Recorder:
    """The client's writes for each result, in one gradebook connection: nbgrader's
    ``autograde`` bookkeeping, without reading, repairing or converting a notebook again.

    ``api``: nbgrader's API on the course (its directories, settings and logger).
    """

    def __init__(self, api: Any) -> None:
        from nbgrader.api import Gradebook
        from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades

        self.api = api
        self.coursedir = api.coursedir
        self.gradebook = Gradebook(self.coursedir.db_url, self.coursedir.course_id)
        self.scores = SaveAutoGrades(parent=api)
        self.late = AssignLatePenalties(parent=api)
        self.late.init_plugin()

    def close(self) -> None:
        self.gradebook.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def record(self, assignment: str, graded: Graded, feedback: bool) -> None:
        """``graded`` into the gradebook (one transaction), ``autograded/`` and (when asked)
        ``feedback/``."""
        from nbformat.v4 import reads

        # Notebooks nbgrader's autograde wrote on the worker (read there, repaired, checked):
        # read as version 4, not validated again.
        notebooks = {
            Path(name).stem: reads(data.decode("utf-8"))  # type: ignore[no-untyped-call]
            for name, data in graded.notebooks.items()
        }
        session = self.gradebook.db
        self.gradebook.db = transaction = _OneTransaction(session)
        try:
            self._submission(assignment, graded.student)
            known = {n.name for n in self.gradebook.find_assignment(assignment).notebooks}
            for name, nb in notebooks.items():
                if name in known:  # as autograde, which skips a notebook it does not know
                    self._notebook(assignment, graded.student, name, nb)
            if transaction.rolled_back:
                raise RuntimeError("the gradebook rolled back part of this student's rows")
            session.commit()
        except Exception:
            session.rollback()
            raise
        finally:
            self.gradebook.db = session
        dest = self.coursedir.format_path(self.coursedir.autograded_directory, graded.student,
                                          assignment)
        _replace_folder(Path(dest), graded.graded, graded.modes)
        if feedback:
            folder = self.coursedir.format_path(self.coursedir.feedback_directory,
                                                graded.student, assignment)
            _replace_folder(Path(folder), graded.feedback, {})

    def _submission(self, assignment: str, student: str) -> None:
        """nbgrader ``Autograde.init_assignment``'s rows: the student, the submission and its
        timestamp, and zero for each notebook of the assignment not submitted."""
        gb = self.gradebook
        gb.update_or_create_student(student)
        src = self.coursedir.format_path(self.coursedir.submitted_directory, student, assignment)
        timestamp = self.coursedir.get_existing_timestamp(src)
        if timestamp:
            gb.update_or_create_submission(assignment, student, timestamp=timestamp)
        else:
            gb.update_or_create_submission(assignment, student)
        for notebook in gb.find_assignment(assignment).notebooks:
            if not os.path.exists(os.path.join(src, f"{notebook.name}.ipynb")):
                for grade in gb.find_submission_notebook(notebook.name, assignment,
                                                         student).grades:
                    grade.auto_score = 0
                    grade.needs_manual_grade = False
                gb.db.commit()

    def _notebook(self, assignment: str, student: str, name: str, nb: Any) -> None:
        """One graded notebook's rows: nbgrader's ``SaveAutoGrades`` (scores from the cells'
        outputs, comments), ``AssignLatePenalties``' rule, and the course's flagged mark."""
        from nbconvert.preprocessors import Preprocessor

        from course.notebooks.flags import flags_of

        gb = self.gradebook
        resources = {"nbgrader": {"student": student, "assignment": assignment,
                                  "notebook": name, "db_url": self.coursedir.db_url}}
        scores = self.scores
        scores.notebook_id, scores.assignment_id, scores.student_id = name, assignment, student
        scores.gradebook = gb
        # SaveAutoGrades.preprocess less its own connection: nbconvert's per-cell pass, which
        # calls SaveAutoGrades.preprocess_cell on each cell.
        Preprocessor.preprocess(scores, nb, resources)  # type: ignore[no-untyped-call]
        submission = gb.find_submission(assignment, student)
        notebook = gb.find_submission_notebook(name, assignment, student)
        notebook.late_submission_penalty = None
        if submission.total_seconds_late > 0:
            penalty = self.late.plugin_inst.late_submission_penalty(
                student, notebook.score, submission.total_seconds_late)
            if penalty is not None:
                notebook.late_submission_penalty = self.late._check_late_penalty(notebook,
                                                                                 penalty)
        notebook.flagged = bool(flags_of(nb))
        gb.db.commit()


def grade_on_cluster(
    client: Any, root: Path, assignment: str, students: list[str], *, force: bool,
    feedback: bool, api: Any, report: Any, prepare: Any = None,
    regrade: frozenset[str] = frozenset(),
) -> None:
    """Grade ``students`` on the cluster of ``client``; this process writes the course.

    ``api`` is nbgrader's API on the course. ``prepare()``, when given, puts the assignment
    in the gradebook: it runs while the workers grade, before the first result is written.
    Each student's outcome goes to ``report(student=, success=, skipped=, seconds=, error=,
    log=)``. Students in ``regrade`` are graded even when up to date.
    """
    # The assignment's notebooks, as generate_assignment puts them in the gradebook.
    notebooks = sorted(p.name for p in (root / "solutions" / assignment).glob("*.ipynb"))
    todo = {}
    for student in students:
        if not (force or student in regrade) and up_to_date(api.coursedir, assignment, student,
                                                            notebooks):
            report(student=student, success=True, skipped=True, seconds=0.0, error="", log="")
            continue
        todo[student] = task_of(root, assignment, student)
    bundle = assignment_bundle(root, assignment, api.config,
                               gradebook_duedate(api, assignment))
    futures = submit(client, bundle, todo, feedback)
    if prepare is not None:
        prepare()
    with Recorder(api) as recorder:
        for graded in results(client, futures):
            report(**_record(recorder, assignment, graded, feedback))


def _record(recorder: Recorder, assignment: str, graded: Graded, feedback: bool) -> dict[str, Any]:
    """Write one worker's result into the course; the student's outcome."""
    start = time.perf_counter()
    outcome = dict(student=graded.student, success=graded.success, skipped=False,
                   error=graded.error, log=graded.log)
    if graded.success:
        try:
            recorder.record(assignment, graded, feedback)
        except Exception as err:  # one result that cannot be written does not stop the batch
            outcome.update(success=False, error=f"recording the result failed: "
                                                f"{type(err).__name__}: {err}")
    return dict(outcome, seconds=graded.worker_s + time.perf_counter() - start)
