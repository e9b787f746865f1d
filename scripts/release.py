"""Regenerate exercises/ from solutions/ with ``nbgrader generate_assignment``.

Each assignment is generated in a throwaway course directory (so the
repository's gradebook is left alone), then copied over
``exercises/<assignment>/``. The output depends only on the source
notebooks: running it twice gives identical files, and
``tests/grading/test_nbgrader_e2e.py`` checks that the committed exercises equal a
fresh generation.

Usage: ``python scripts/release.py [--output DIR] [ASSIGNMENT ...]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from course.apps.scratch import NbgraderError, assignment_ids, generate_assignment, make_course

ROOT = Path(__file__).resolve().parents[1]


def release(assignments: list[str], output: Path) -> None:
    """Generate each assignment and replace ``output/<assignment>`` with the result."""
    with tempfile.TemporaryDirectory(prefix="kvlib-release-") as tmp:
        course = make_course(Path(tmp), ROOT, assignments, sandbox="off")
        for assignment in assignments:
            generate_assignment(course, assignment)
            target = output / assignment
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(course / "exercises" / assignment, target)
            print(f"released {assignment} -> {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="default: every folder in solutions/")
    parser.add_argument("--output", type=Path, default=ROOT / "exercises")
    args = parser.parse_args(argv)
    known = assignment_ids(ROOT)
    unknown = sorted(set(args.assignments) - set(known))
    if unknown:
        print(f"unknown assignment(s) {unknown}; solutions/ has {known}", file=sys.stderr)
        return 2
    try:
        release(args.assignments or known, args.output.resolve())
    except NbgraderError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
