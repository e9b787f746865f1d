"""``kvlib grade``: self-check one exercise notebook with the course's grader."""

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
    """Grade the notebook (nbgrader is imported only here, and only when installed)."""
    from kvlib.grading import selfcheck

    if not selfcheck.grader_installed():
        return fail("grade", selfcheck.MISSING_GRADER)
    return selfcheck.main(args.notebook, args.json)
