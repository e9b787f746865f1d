"""Grading a class: serial nbgrader, ``make grade`` on all cores, and on a Dask cluster.

Copies of the course are made in a temporary folder, each with the same N
honest submissions of chapter 1 (each student on their own numbers), and graded:

- serial: ``nbgrader autograde``, ``nbgrader generate_feedback`` and
  ``nbgrader export``, one after another, as an instructor without ``make``;
- pool: ``make grade ASSIGNMENT=01_kv_cache``, as the README shows it (one
  worker process per core);
- dask N: ``make grade ... SCHEDULER=...`` on a cluster started here on loopback
  (``dask scheduler`` and N ``dask worker`` processes, one task at a time each),
  for N = 1 and 2; starting the cluster is not timed.

All run the same sandbox, limits and hidden-test path (``nbgrader_config.py``).
Printed, as a Markdown table headed by the machine (cores, CPU model, date):
wall seconds, the ratio of serial's seconds to each (the speed-up), each one's
seconds over the pool's (the Dask path on one machine aims at 1.10 or less),
and CPU seconds per submission of every process this script started and reaped
(graders, workers, and the kernels they reaped; for Dask, less what the
scheduler and workers had used to start, which is not timed either); then two
Dask workers' speed over one's (aimed at 1.8 or more). Every path's result is
compared with the pool's: each student's row of ``grades.csv`` (score, late
penalty, flags), each cell's gradebook rows (scores, comments, the notebook's
flagged mark), the graded notebooks and the feedback pages; a difference is
printed and the exit status is 1. With
``--profile`` the client of each Dask run (``python -m course.apps.batch``, the
command ``make grade`` runs) runs under cProfile, and its top entries by
cumulative time are printed: what the one process that writes the course
spends its time on. The figures are printed, never asserted: they depend on
the machine and on what else runs on it (the load average is printed beside
them).

Usage: ``python scripts/bench_autograde.py [--students N] [--skip-serial] [--workers 1 2]
[--profile [ENTRIES]]``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import json
import os
import platform
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from course.apps.scratch import run_nbgrader

ROOT = Path(__file__).resolve().parents[1]

ASSIGNMENT, NOTEBOOK = "01_kv_cache", "kv_cache"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
COURSE_FILES = ("Makefile", "nbgrader_config.py", "requirements.txt", "constraints.txt",
                "pyproject.toml")


def make_course(target: Path) -> Path:
    """A course folder: the files ``make grade`` needs, and this checkout's built venv."""
    target.mkdir(parents=True)
    for name in COURSE_FILES:
        shutil.copy2(ROOT / name, target / name)
    for folder in ("solutions", "exercises"):
        shutil.copytree(ROOT / folder / ASSIGNMENT, target / folder / ASSIGNMENT)
    venv = target / ".venv"
    venv.mkdir()
    for entry in (ROOT / ".venv").iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()  # built: make must not reinstall
    return target


def right_answers() -> dict[str, str]:
    """Each answer cell of the solution notebook, its solution markers removed: the
    answers of a student who solved every challenge."""
    nb = nbformat.read(ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    answers = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and MARKERS[0] in cell.source:
            lines = cell.source.splitlines()
            answers[meta["grade_id"]] = "\n".join(x for x in lines if x.strip() not in MARKERS)
    return answers


def submit(course: Path, students: int) -> None:
    right = right_answers()
    nb = nbformat.read(course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    for cell in nb.cells:
        cell.source = right.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source)
    for k in range(students):
        path = course / "submitted" / f"student{k:03d}" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    seconds: float
    cpu_s: float


def timed(label: str, run: Any) -> Run:
    """Wall and CPU seconds of ``run()`` (CPU of the child processes it reaped)."""
    start, cpu = time.perf_counter(), _children_cpu_s()
    run()
    seconds = time.perf_counter() - start
    used = _children_cpu_s() - cpu
    print(f"  {label:<60} {seconds:7.1f} s wall, {used:6.1f} s CPU", flush=True)
    return Run(seconds, used)


def serial(course: Path) -> Run:
    run_nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")  # set-up, not timed
    runs = [
        timed(f"nbgrader {step}", lambda step=step: run_nbgrader(course, *step.split()))
        for step in (f"autograde {ASSIGNMENT}", f"generate_feedback {ASSIGNMENT}", "export")
    ]
    return Run(sum(r.seconds for r in runs), sum(r.cpu_s for r in runs))


ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
       "LANG": "C.UTF-8"}


def in_course(course: Path, command: list[str], label: str) -> Run:
    """``command`` run in ``course``, timed; its output's end shown if it fails."""

    def run() -> None:
        done = subprocess.run(command, cwd=course, env=ENV, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{label} failed ({done.returncode}):\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    return timed(label, run)


def make_grade(course: Path, *extra: str) -> Run:
    command = ["make", "grade", f"ASSIGNMENT={ASSIGNMENT}", *extra]
    return in_course(course, command, " ".join(command))


@contextlib.contextmanager
def loopback_cluster(folder: Path, workers: int) -> Iterator[tuple[str, list[Any]]]:
    """A scheduler and ``workers`` single-task workers on 127.0.0.1; stopped and reaped
    (so that their CPU time is counted) on exit."""
    dask = str(ROOT / ".venv" / "bin" / "dask")
    info = folder / "scheduler.json"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": folder}
    processes = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0",
                                   "--no-dashboard", "--scheduler-file", str(info)], **quiet)]
    try:
        while not info.exists():
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        processes += [
            subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny",
                              "--no-dashboard", "--host", "127.0.0.1"], **quiet)
            for _ in range(workers)
        ]
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=300)
        yield address, processes
    finally:
        for process in reversed(processes):  # workers first, while the scheduler is up
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _cpu_so_far_s(processes: list[Any]) -> float:
    """CPU seconds the running ``processes`` (and the children they reaped) have used."""
    import psutil  # type: ignore[import-untyped]

    total = 0.0
    for process in processes:
        times = psutil.Process(process.pid).cpu_times()
        total += times.user + times.system + times.children_user + times.children_system
    return total


def profiled_client(course: Path, address: str, profile: Path) -> Run:
    """The command ``make grade ... SCHEDULER=`` runs, under cProfile (written to ``profile``)."""
    python = str(course / ".venv" / "bin" / "python")
    command = [python, "-m", "cProfile", "-o", str(profile), "-m", "course.apps.batch", ASSIGNMENT,
               "--scheduler", address]
    return in_course(course, command,
                     f"python -m cProfile -m course.apps.batch {ASSIGNMENT} --scheduler {address}")


def print_profile(profile: Path, entries: int) -> None:
    """The client's ``entries`` top functions by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(str(profile), stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(entries)
    table = out.getvalue().split("ncalls", 1)[-1]
    print(f"  the client's top {entries} entries by cumulative time:\n    ncalls" +
          "\n    ".join(line for line in table.splitlines() if line.strip()), flush=True)


def on_dask(course: Path, workers: int, profile_entries: int) -> Run:
    with loopback_cluster(course.parent, workers) as (address, processes):
        started_cpu_s = _cpu_so_far_s(processes)  # starting the cluster: not counted
        cpu = _children_cpu_s()
        if profile_entries:
            run = profiled_client(course, address, course.parent / "client.prof")
        else:
            run = make_grade(course, f"SCHEDULER={address}")
    # Everything reaped since ``cpu`` was read: the client, then (after the block) the
    # scheduler and workers, with the kernels they reaped.
    used = _children_cpu_s() - cpu - started_cpu_s
    if profile_entries:
        print_profile(course.parent / "client.prof", profile_entries)
    return Run(run.seconds, used)


def result_of(course: Path) -> dict[str, Any]:
    """What grading gave, as every path must give it: by student, the row of ``grades.csv``,
    the gradebook's rows of each graded cell (automatic and manual scores and comments),
    the notebook's flagged mark and late penalty, the graded notebook's cells (source and
    outputs) and metadata, and the feedback page."""
    from nbgrader.api import Gradebook

    with open(course / "grades.csv", newline="") as f:
        found: dict[str, Any] = {f"grades.csv {row['student_id']}": row
                                 for row in csv.DictReader(f)}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for submission in gb.find_assignment(ASSIGNMENT).submissions:
            for nb in submission.notebooks:
                found[f"gradebook {submission.student.id}/{nb.name}"] = (
                    str(submission.timestamp), nb.flagged, nb.late_submission_penalty,
                    sorted((g.name, g.auto_score, g.manual_score, g.needs_manual_grade)
                           for g in nb.grades),
                    sorted((c.name, c.auto_comment, c.manual_comment) for c in nb.comments),
                )
    for student in sorted(p.name for p in (course / "submitted").iterdir()):
        graded = nbformat.read(course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb",
                               as_version=4)
        found[f"autograded {student}"] = [
            (c.cell_type, c.source, c.get("outputs")) for c in graded.cells
        ] + [graded.metadata.get("kvlib")]
        page = course / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html"
        found[f"feedback {student}"] = page.read_bytes() if page.is_file() else None
    return found


def differences(result: dict[str, Any], pool: dict[str, Any]) -> list[str]:
    """The entries of ``result`` not equal to the pool's (or missing from either)."""
    return sorted(k for k in result.keys() | pool.keys() if result.get(k) != pool.get(k))


def machine() -> str:
    """Cores, CPU model (``/proc/cpuinfo``), system and today's date."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, "
            f"{datetime.date.today().isoformat()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--skip-serial", action="store_true")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2],
                        help="Dask cluster sizes to run (none: skip Dask)")
    parser.add_argument("--profile", type=int, nargs="?", const=25, default=0,
                        metavar="ENTRIES",
                        help="profile each Dask run's client; print its top ENTRIES (25)")
    args = parser.parse_args(argv)
    if args.students < 1:
        parser.error("--students must be at least 1")
    print(f"{args.students} honest submissions of {ASSIGNMENT}; {machine()}; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    plans: list[tuple[str, Any]] = [("pool", make_grade)]
    if not args.skip_serial:
        plans.insert(0, ("serial", serial))
    plans += [(f"dask {n}", lambda c, n=n: on_dask(c, n, args.profile)) for n in args.workers]
    results: dict[str, Run] = {}
    graded: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvlib-bench-") as tmp:
        for name, grade in plans:
            course = make_course(Path(tmp) / name.replace(" ", "_") / "course")
            submit(course, args.students)
            print(f"{name}:", flush=True)
            results[name] = grade(course)
            graded[name] = result_of(course)
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    base, pool = results.get("serial"), results["pool"]
    print(f"{args.students} submissions; {machine()}\n")
    print("| grading | seconds | serial / this | this / pool | CPU s per submission |")
    print("|---|---:|---:|---:|---:|")
    for name, run in results.items():
        ratio = f"{base.seconds / run.seconds:.2f}x" if base else "-"
        print(f"| {name} | {run.seconds:.1f} | {ratio} | {run.seconds / pool.seconds:.2f} | "
              f"{run.cpu_s / args.students:.2f} |")
    if "dask 1" in results and "dask 2" in results:
        print(f"\ntwo Dask workers: {results['dask 1'].seconds / results['dask 2'].seconds:.2f}x "
              "one worker's speed (aim: 1.80x or more); "
              f"{results['dask 2'].seconds / pool.seconds:.2f} of the pool's time (aim: 1.10 "
              "or less)")
    status = 0
    for name, result in graded.items():
        if name == "pool":
            continue
        differ = differences(result, graded["pool"])
        print(f"{name}: " + ("the same grades, flags, graded notebooks and feedback as the pool"
                             if not differ else
                             f"{len(differ)} result(s) differ from the pool's: "
                             + ", ".join(differ[:8])))
        status |= bool(differ)
    return status


if __name__ == "__main__":
    sys.exit(main())
