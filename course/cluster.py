"""``make grade ... SCHEDULER=tcp://host:8786``: the same grading, kernels run on Dask.

The work splits where the state is:

- a **worker** (:func:`grade_remotely`) gets bytes, never paths: one
  student's submitted files, and the assignment (its ``solutions/`` and
  ``exercises/`` files and the course's grading settings, sent once to each
  worker). In a scratch course of its own it runs nbgrader's ``autograde``
  and ``generate_feedback`` with the course's settings (sandbox, limits,
  repair, hidden tests outside the kernel) and returns the graded notebooks
  and the feedback files. It needs no shared file system and never sees the
  course's gradebook.
- the **client** (:func:`grade_on_cluster`, in ``make grade``) alone writes
  the course: for each result, nbgrader's own ``autograde`` runs here with
  the kernel step replaced by :class:`ReplayExecute`, which puts the outputs
  the worker's kernel produced into the notebook instead of running it; so
  the gradebook (SQLite, or ``$KVLIB_GRADEBOOK_URL``), ``autograded/`` and,
  at the end, ``grades.csv`` are written by the same code as on one machine,
  and the scores are the same cell by cell. Feedback pages come back built.

A worker that dies mid-task: the scheduler runs its tasks elsewhere, and the
client writes only whole results, so every student is graded once. A client
interrupted: what it wrote is graded work, skipped on the next run (as
``nbgrader autograde`` skips it) unless ``--force``.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from course.flags import add_flag, flags_of

__all__ = [
    "SCHEDULER_ENV",
    "Assignment",
    "Graded",
    "ReplayExecute",
    "SchedulerUnreachable",
    "assignment_bundle",
    "grade_on_cluster",
    "grade_remotely",
]

SCHEDULER_ENV = "KVLIB_DASK_SCHEDULER"
# Sections of the course's nbgrader settings a worker must apply as the course does.
_SETTINGS = ("Execute", "VerifiedExecute", "SandboxedKernelManager")
_CONNECT_TIMEOUT_S = 20  # a scheduler started a moment ago, on a busy machine


class SchedulerUnreachable(RuntimeError):
    """No Dask scheduler answered at the address given."""


@dataclass(frozen=True)
class Assignment:
    """What every task of one assignment shares: files by path relative to the assignment's
    folder, and the course's grading settings (nbgrader config sections, as JSON)."""

    name: str
    source: dict[str, bytes]
    release: dict[str, bytes]
    settings: str

    @property
    def digest(self) -> str:
        """Names a worker's scratch course: the same assignment, the same folder."""
        h = hashlib.sha256(self.name.encode() + self.settings.encode())
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
    notebooks: dict[str, bytes] = field(default_factory=dict)  # name.ipynb -> graded notebook
    feedback: dict[str, bytes] = field(default_factory=dict)  # relative path -> file
    worker_s: float = 0.0
    worker_cpu_s: float = 0.0


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


def assignment_bundle(root: Path, assignment: str, config: Any) -> Assignment:
    """The assignment's files and the course's grading settings, from the course ``root``."""
    settings = {
        name: {k: v for k, v in config[name].items() if k != "course_root"}
        for name in _SETTINGS
        if name in config
    }
    return Assignment(
        name=assignment,
        source=_files(root / "solutions" / assignment),
        release=_files(root / "exercises" / assignment),
        settings=json.dumps(settings, sort_keys=True),
    )


# ---- the worker side -------------------------------------------------------------------

_SCRATCH_CONFIG = '''"""A worker's scratch course: the course's settings, its own gradebook."""

import json

from traitlets.config import Config

from course.autograde import configure

c = get_config()  # noqa: F821
configure(c, {root!r}, db_url={db_url!r})
c.merge(Config(json.loads({settings!r})))
c.SandboxedKernelManager.course_root = {root!r}
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


def _scratch(assignment: Assignment) -> tuple[Path, Any]:
    """This worker process's course for ``assignment``, made (and the assignment put in its
    gradebook) on first use."""
    if assignment.digest in _SCRATCH:
        return _SCRATCH[assignment.digest]
    from course.scratch import nbgrader_api, scripts_on_path

    root = Path(tempfile.mkdtemp(prefix=f"kvlib-worker-{assignment.digest}-"))
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
    _SCRATCH[assignment.digest] = root, api
    return root, api


def grade_remotely(
    assignment: Assignment, student: str, submitted: dict[str, bytes], feedback: bool = True
) -> Graded:
    """Autograde one student (and give feedback) in this worker's scratch course."""
    with _ONE_AT_A_TIME:
        return _grade_here(assignment, student, submitted, feedback)


def _grade_here(
    assignment: Assignment, student: str, submitted: dict[str, bytes], feedback: bool
) -> Graded:
    from course.scratch import scripts_on_path

    start, cpu = time.perf_counter(), time.process_time()
    root, api = _scratch(assignment)
    os.chdir(root)
    for folder in ("submitted", "autograded", "feedback"):
        shutil.rmtree(root / folder / student, ignore_errors=True)
    _write(root / "submitted" / student / assignment.name, submitted)
    escaped = glob.escape(student)  # nbgrader globs the student id
    with scripts_on_path():
        graded = api.autograde(assignment.name, escaped, force=True, create=True)
        log = str(graded.get("log") or "")
        given: dict[str, Any] = {"success": not feedback}
        if graded.get("success") and feedback:
            given = api.generate_feedback(assignment.name, escaped, force=True)
            log += str(given.get("log") or "")
    out = root / "autograded" / student / assignment.name
    return Graded(
        student=student,
        success=bool(graded.get("success")) and bool(given.get("success")),
        log=log,
        error=str(graded.get("error") or given.get("error") or ""),
        notebooks={p.name: p.read_bytes() for p in sorted(out.glob("*.ipynb"))},
        feedback=_files(root / "feedback" / student / assignment.name),
        worker_s=time.perf_counter() - start,
        worker_cpu_s=time.process_time() - cpu,
    )


# ---- the client side -------------------------------------------------------------------


class ReplayExecute(NbGraderPreprocessor):  # type: ignore[misc]
    """Autograde's kernel step on the client: the outputs and flags of the notebook a worker
    graded (:attr:`graded`, by student and notebook) instead of running any code."""

    graded: dict[tuple[str, str], NotebookNode] = {}

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any]
    ) -> tuple[NotebookNode, dict[str, Any]]:
        info = resources["nbgrader"]
        ran = self.graded.pop((info["student"], info["notebook"]))
        if [c.get("id") for c in ran.cells] != [c.get("id") for c in nb.cells]:
            raise ValueError(f"the notebook graded remotely for {info['student']} does not "
                             "match the submission read here")
        for cell, done in zip(nb.cells, ran.cells, strict=True):
            if cell.cell_type == "code":
                cell.outputs = done.get("outputs", [])
                cell.execution_count = done.get("execution_count")
        # The worker's flags are the same repairs as here (same bytes, same release), then
        # what its kernel did; links were set aside here only, so this side's repairs lead.
        mine = flags_of(nb)
        added = list(flags_of(ran))
        for flag in mine:
            if flag in added:
                added.remove(flag)
        for flag in added:
            add_flag(nb, flag)
        return nb, resources


def replaying(config: Any) -> Any:
    """``config`` with autograde's executing step replaced by :class:`ReplayExecute`."""
    from course.execute import VerifiedExecute

    steps = list(config.Autograde.autograde_preprocessors)
    config.Autograde.autograde_preprocessors = [
        ReplayExecute if step is VerifiedExecute else step for step in steps
    ]
    return config


def connect(address: str) -> Any:
    """A Dask client on the scheduler at ``address``, or :class:`SchedulerUnreachable`."""
    from distributed import Client

    try:
        return Client(address, timeout=_CONNECT_TIMEOUT_S, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as err:
        raise SchedulerUnreachable(
            f"no Dask scheduler answered at {address} within {_CONNECT_TIMEOUT_S} s "
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


def results(
    client: Any, assignment: Assignment, submissions: dict[str, dict[str, bytes]], feedback: bool
) -> Iterator[Graded]:
    """Grade every submission on the cluster; results as they complete. A task whose worker
    died is run again elsewhere by the scheduler; one that raised is a failed result."""
    from distributed import as_completed

    shared = client.scatter(assignment, broadcast=True)
    batch = uuid.uuid4().hex[:8]
    futures = {
        client.submit(grade_remotely, shared, student, files, feedback, pure=False,
                      key=f"grade-{assignment.name}-{student}-{batch}"): student
        for student, files in submissions.items()
    }
    for future in as_completed(futures, loop=client.loop):  # type: ignore[no-untyped-call]
        try:
            yield future.result()
        except Exception as err:  # the task raised on its worker, or lost too many workers
            yield Graded(futures[future], False, "", f"{type(err).__name__}: {err}")


def write_feedback(root: Path, assignment: str, graded: Graded) -> None:
    folder = root / "feedback" / graded.student / assignment
    shutil.rmtree(folder, ignore_errors=True)
    _write(folder, graded.feedback)


def grade_on_cluster(
    client: Any, root: Path, assignment: str, students: list[str], *, force: bool,
    feedback: bool, api: Any, report: Any,
) -> None:
    """Grade ``students`` on the cluster of ``client``; this process writes the course.

    ``api`` is nbgrader's API on the course with :func:`replaying` settings. Each student's
    outcome goes to ``report(student=, success=, skipped=, seconds=, error=, log=)``.
    """
    from nbgrader.api import Gradebook

    with Gradebook(api.coursedir.db_url) as gb:
        notebooks = [f"{n.name}.ipynb" for n in gb.find_assignment(assignment).notebooks]
    todo = {}
    for student in students:
        if not force and up_to_date(api.coursedir, assignment, student, notebooks):
            report(student=student, success=True, skipped=True, seconds=0.0, error="", log="")
            continue
        todo[student] = _files(root / "submitted" / student / assignment)
    bundle = assignment_bundle(root, assignment, api.config)
    for graded in results(client, bundle, todo, feedback):
        report(**_record(root, assignment, graded, api, feedback))


def _record(
    root: Path, assignment: str, graded: Graded, api: Any, feedback: bool
) -> dict[str, Any]:
    """Write one worker's result into the course: gradebook and ``autograded/`` (nbgrader's
    autograde, replaying), then ``feedback/``. Returns the student's outcome."""
    import nbformat

    start = time.perf_counter()
    if not graded.success:
        return dict(student=graded.student, success=False, skipped=False,
                    seconds=graded.worker_s, error=graded.error, log=graded.log)
    for name, data in graded.notebooks.items():
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)  # type: ignore[no-untyped-call]
        ReplayExecute.graded[(graded.student, Path(name).stem)] = nb
    result = api.autograde(assignment, glob.escape(graded.student), force=True, create=True)
    for key in [k for k in ReplayExecute.graded if k[0] == graded.student]:
        del ReplayExecute.graded[key]  # a notebook the client did not read (it failed)
    ok = bool(result.get("success"))
    if ok and feedback:
        write_feedback(root, assignment, graded)
    return dict(
        student=graded.student,
        success=ok,
        skipped=False,
        seconds=graded.worker_s + time.perf_counter() - start,
        error=str(result.get("error") or ""),
        log=graded.log + str(result.get("log") or ""),
    )
