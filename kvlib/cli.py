"""The ``kvlib`` command line: dispatch only, to the modules of :mod:`kvlib.commands`.

Other packages add subcommands through the ``kvlib.commands`` entry-point group (a
``register(subparsers)`` function each): the course adds ``kvlib grade`` that way, so
kvlib never imports the course that grades its exercises.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import kvlib.commands

__all__ = ["ENTRY_POINT_GROUP", "main", "parser"]

ENTRY_POINT_GROUP = "kvlib.commands"


def parser(*, plugins: bool = True) -> argparse.ArgumentParser:
    """The ``kvlib`` argument parser with every subcommand registered: kvlib's own, and
    with ``plugins`` those of the ``kvlib.commands`` entry points."""
    return _parser(plugins)[0]


def _parser(plugins: bool) -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser, and the names of the subcommands it knows."""
    root = argparse.ArgumentParser(
        prog="kvlib", description="KV cache and LLM serving arithmetic, from real configs."
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(kvlib.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvlib.commands.{info.name}")
        if hasattr(module, "register"):  # helper modules (tables) register nothing
            module.register(commands)
    if plugins:
        from importlib import metadata  # a heavy import (email, zipfile...): only when needed

        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            entry.load()(commands)
    return root, set(commands.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvlib`` command; returns the exit status.

    The entry points are looked up (a scan of every installed package's metadata, tens
    of milliseconds) only when the command asked for is not one of kvlib's own.
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    root, known = _parser(plugins=False)
    wanted = next((a for a in args_in if not a.startswith("-")), None)
    if wanted not in known:
        root = parser()
    args = root.parse_args(args_in)
    status: int = args.handler(args)
    return status
