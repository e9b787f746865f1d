"""``kvlib grade``: self-check one exercise notebook with the course's grader
(:mod:`course.selfcheck`); kvlib itself never imports nbgrader."""

from __future__ import annotations

import argparse
from typing import Any

from kvlib.commands import fail

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``kvlib grade`` to the subcommands."""
    grade = commands.add_parser("grade", help="self-check one exercise notebook")
    grade.add_argument("notebook", help="path to an exercises/NN_slug/*.ipynb notebook")
    grade.add_argument("--json", action="store_true", help="print one JSON object")
    grade.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Grade the notebook with the course's self-check, when the course is installed."""
    try:
        from course import selfcheck
    except ImportError:
        return fail("grade", "the course's grader is not installed: run `make check NB=...` "
                    "from the course repository")
    if not selfcheck.grader_installed():
        return fail("grade", selfcheck.MISSING_GRADER)
    return selfcheck.main(args.notebook, args.json)
