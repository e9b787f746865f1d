"""Grading a class: ``make grade`` (all cores) against serial nbgrader, wall-clock seconds.

Two copies of the course are made in a temporary folder, each with the same N
honest submissions of chapter 1 (each student on their own numbers):

- serial: ``nbgrader autograde``, ``nbgrader generate_feedback`` and
  ``nbgrader export``, one after another, as an instructor without ``make``;
- parallel: ``make grade ASSIGNMENT=01_kv_cache``, exactly as the README shows
  it (assignment added to the gradebook, autograde, feedback, export).

Both run the same sandbox, limits and hidden-test path (``nbgrader_config.py``).
The figures are printed, never asserted: they depend on the machine and on what
else runs on it (the load average is printed beside them).

Usage: ``python scripts/bench_autograde.py [--students N] [--skip-serial]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course.scratch import run_nbgrader  # noqa: E402

ASSIGNMENT, NOTEBOOK = "01_kv_cache", "kv_cache"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
COURSE_FILES = ("Makefile", "nbgrader_config.py", "requirements.txt", "constraints.txt",
                "pyproject.toml")  # fmt: skip


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


def timed(label: str, run: object) -> float:
    """Wall seconds of ``run()``; also prints the CPU seconds of the grading processes
    (student kernels excluded: they are killed, not reaped, so their CPU is not counted)."""
    start, cpu = time.perf_counter(), _children_cpu_s()
    run()  # type: ignore[operator]
    seconds = time.perf_counter() - start
    print(f"  {label:<40} {seconds:7.1f} s wall, {_children_cpu_s() - cpu:6.1f} s CPU (grader)",
          flush=True)  # fmt: skip
    return seconds


def serial(course: Path) -> float:
    run_nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")  # set-up, not timed
    return sum(
        timed(f"nbgrader {step}", lambda step=step: run_nbgrader(course, *step.split()))
        for step in (f"autograde {ASSIGNMENT}", f"generate_feedback {ASSIGNMENT}", "export")
    )


def parallel(course: Path) -> float:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}  # fmt: skip

    def make() -> None:
        subprocess.run(["make", "grade", f"ASSIGNMENT={ASSIGNMENT}"], cwd=course, env=env,
                       check=True, capture_output=True)  # fmt: skip

    return timed(f"make grade ASSIGNMENT={ASSIGNMENT}", make)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--skip-serial", action="store_true")
    args = parser.parse_args(argv)
    print(f"{args.students} honest submissions of {ASSIGNMENT}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kvlib-bench-") as tmp:
        results = {}
        for name, grade in (("parallel", parallel), ("serial", serial)):
            if name == "serial" and args.skip_serial:
                continue
            course = make_course(Path(tmp) / name)
            submit(course, args.students)
            print(f"{name}:")
            results[name] = grade(course)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    for name, seconds in results.items():
        print(f"{name:>8}: {seconds:6.1f} s in all, {seconds / args.students:.2f} s per submission")
    if len(results) == 2:
        print(
            f" speed-up: {results['serial'] / results['parallel']:.2f}x (target: parallel <= 60 s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
