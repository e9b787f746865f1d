"""The ``kvlib`` command line: dispatch only, to the modules of :mod:`kvlib.commands`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Sequence

import kvlib.commands

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The ``kvlib`` argument parser with every subcommand registered."""
    root = argparse.ArgumentParser(
        prog="kvlib", description="KV cache and LLM serving arithmetic, from real configs."
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(kvlib.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvlib.commands.{info.name}")
        if hasattr(module, "register"):  # helper modules (tables) register nothing
            module.register(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvlib`` command; returns the exit status."""
    args = parser().parse_args(argv)
    status: int = args.handler(args)
    return status
