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
Printed: wall seconds, the ratio of serial's seconds to each, and CPU seconds
per submission of every process this script started and reaped (graders,
workers, and the kernels they reaped). The figures are printed, never
asserted: they depend on the machine and on what else runs on it (the load
average is printed beside them).

Usage: ``python scripts/bench_autograde.py [--students N] [--skip-serial] [--workers 1 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

from course.scratch import run_nbgrader

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


def make_grade(course: Path, *extra: str) -> Run:
    command = ["make", "grade", f"ASSIGNMENT={ASSIGNMENT}", *extra]
    return timed(" ".join(command),
                 lambda: subprocess.run(command, cwd=course, env=ENV, check=True,
                                        capture_output=True))


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


def on_dask(course: Path, workers: int) -> Run:
    with loopback_cluster(course.parent, workers) as (address, processes):
        cpu = _children_cpu_s()
        run = make_grade(course, f"SCHEDULER={address}")
    # The workers' CPU is counted once they are reaped, after the block.
    return Run(run.seconds, run.cpu_s + _children_cpu_s() - cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--skip-serial", action="store_true")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2],
                        help="Dask cluster sizes to run (none: skip Dask)")
    args = parser.parse_args(argv)
    print(f"{args.students} honest submissions of {ASSIGNMENT}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    plans: list[tuple[str, Any]] = [("pool", make_grade)]
    if not args.skip_serial:
        plans.insert(0, ("serial", serial))
    plans += [(f"dask {n}", lambda c, n=n: on_dask(c, n)) for n in args.workers]
    results: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="kvlib-bench-") as tmp:
        for name, grade in plans:
            course = make_course(Path(tmp) / name.replace(" ", "_") / "course")
            submit(course, args.students)
            print(f"{name}:", flush=True)
            results[name] = grade(course)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    base = results.get("serial")
    print(f"{'':>8}  {'seconds':>8}  {'serial / this':>13}  {'CPU s per submission':>20}")
    for name, run in results.items():
        ratio = f"{base.seconds / run.seconds:.2f}x" if base else "-"
        print(f"{name:>8}  {run.seconds:8.1f}  {ratio:>13}  {run.cpu_s / args.students:20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
