"""The README's instructor commands, run verbatim in a fresh copy of the course.

The copy holds what a clone holds (files git tracks, and new files git does not
ignore) and this checkout's virtual environment, so ``make`` finds it built.
Three students' submissions are put where the README says; then each command
of the README's instructor section runs, exactly as written, with a plain PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from grading_support import (
    ASSIGNMENT,
    CLASSIC_WRONG,
    NOTEBOOK,
    POINTS,
    RIGHT,
    ROOT,
    TOTAL,
    duplicated_answer,
    grades,
    submitted,
    write,
)
from grading_support import submission as notebook

pytestmark = pytest.mark.notebooks


def instructor_commands() -> list[str]:
    """Shell commands of the code blocks in the README's **Instructor.** paragraph."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**Instructor.**", 1)[1].split("\n**", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def clone(target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    # The built environment, as `make` leaves it: links to this checkout's, stamped now.
    venv = target / ".venv"
    venv.mkdir()
    for entry in (ROOT / ".venv").iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()


def test_readme_shows_make_grade() -> None:
    assert instructor_commands() == [f"make grade ASSIGNMENT={ASSIGNMENT}"]


def test_instructor_commands_verbatim(tmp_path: Path) -> None:
    course = tmp_path / "course"
    clone(course)
    assert not (course / "gradebook.db").exists() and not (course / "submitted").exists()
    release = course / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    students = {
        "amara": notebook(RIGHT, release),
        "bo": notebook({**RIGHT, "answer_seats": CLASSIC_WRONG["seats"][0]}, release),
        "chen": duplicated_answer(release),
    }
    for name, nb in students.items():
        write(nb, submitted(course, name))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}
    dry = subprocess.run(["make", "-n", "grade", f"ASSIGNMENT={ASSIGNMENT}"], cwd=course, env=env,
                         capture_output=True, text=True, check=True)
    assert "pip install" not in dry.stdout  # the linked environment must never be rebuilt
    for command in instructor_commands():
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", command], cwd=course, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        print(f"{command}: {time.monotonic() - start:.1f} s")
    rows = grades(course)
    assert {s: float(r["score"]) for s, r in rows.items()} == {
        "amara": TOTAL, "bo": TOTAL - POINTS["seats"], "chen": TOTAL
    }
    assert rows["amara"]["flags"] == "" and "answer_seats appeared 2 times" in rows["chen"]["flags"]
    for name in students:
        assert (course / "feedback" / name / ASSIGNMENT / f"{NOTEBOOK}.html").is_file()
    assert (course / "gradebook.db").is_file()
