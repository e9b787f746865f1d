"""``kvlib grade NOTEBOOK``: the course's self-check, added to the ``kvlib`` command line.

kvlib never imports the course: its command line loads the subcommands other
packages declare in the ``kvlib.commands`` entry-point group (``pyproject.toml``
declares this module's :func:`register` there). ``python -m course.apps.grade_command
NOTEBOOK [--json]`` runs the same check without the entry point (``make check``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from course.apps import selfcheck

__all__ = ["main", "register", "run"]


def register(commands: Any) -> None:
    """Add ``kvlib grade`` to the subcommands."""
    grade = commands.add_parser("grade", help="self-check one exercise notebook")
    grade.add_argument("notebook", help="path to an exercises/NN_slug/*.ipynb notebook")
    grade.add_argument("--json", action="store_true", help="print one JSON object")
    grade.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Grade the notebook with the course's self-check; one line naming the extra to
    install when nbgrader is missing."""
    if not selfcheck.grader_installed():
        print(f"kvlib grade: error: {selfcheck.MISSING_GRADER}", file=sys.stderr)
        return 2
    return selfcheck.main(args.notebook, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course.apps.grade_command NOTEBOOK [--json]``: ``kvlib grade`` itself."""
    parser = argparse.ArgumentParser(prog="kvlib")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run(parser.parse_args(["grade", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
