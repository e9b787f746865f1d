"""``kvlib grade NOTEBOOK``: self-check one exercise notebook with the course's grader."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``kvlib grade`` to the subcommands."""
    grade = commands.add_parser("grade", help="self-check one exercise notebook")
    grade.add_argument("notebook", help="path to an exercises/NN_slug/*.ipynb notebook")
    grade.add_argument("--json", action="store_true", help="print one JSON object")
    grade.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Grade the notebook (nbgrader is imported only here)."""
    from kvlib.grading import selfcheck

    return selfcheck.main(args.notebook, args.json)
