"""Subcommands of the ``kvlib`` command line, one module each.

Each module defines ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(argparse.Namespace) -> int`` (the exit status).
Modules import only the standard library at import time; a command that needs
torch imports it inside its handler.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["UsageError", "emit", "fail", "report_json"]


class UsageError(Exception):
    """Bad input the user can fix; printed as one line, exit status 2."""


def fail(command: str, message: str) -> int:
    """Print ``kvlib COMMAND: error: MESSAGE`` on stderr; return the usage-error status 2."""
    print(f"kvlib {command}: error: {message}", file=sys.stderr)
    return 2


def report_json(report: Any) -> dict[str, Any]:
    """A report dataclass as a JSON-ready dict of its fields (nested dataclasses too)."""
    if not dataclasses.is_dataclass(report) or isinstance(report, type):
        raise TypeError(f"a report must be a dataclass instance, got {type(report).__name__}")
    return dataclasses.asdict(report)


def emit(report: Any, as_json: bool, render: Callable[[Any], str]) -> int:
    """Print ``report`` as JSON (its fields) or as ``render(report)``; return 0."""
    text = json.dumps(report_json(report), indent=2) if as_json else render(report)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
