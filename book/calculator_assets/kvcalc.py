"""The calculator page's bridge to ``kvlib size``: the page's inputs in, the command's output out.

Runs in the browser on Pyodide, beside the packed kvlib (``scripts/pack_kvlib.py``),
and in CPython for the tests. Nothing here computes a figure: the inputs become the
argument list a shell user would type, the parser that ``kvlib size`` registers parses
it (same defaults, same type conversions, same messages), and the command's own handler
runs with its output captured. The page's JSON is therefore what ``kvlib size --json``
prints, and its errors are the line the CLI prints.

The page talks to this module in JSON strings (``describe_json``, ``compute_json``) so
that no Python object outlives a call.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import math
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlib.commands import size as size_command
from kvlib.config import bundled_models, load_config
from kvlib.dtypes import DTYPE_BITS
from kvlib.hardware import gpu_names

__all__ = [
    "PASTED_CONFIG",
    "compute",
    "compute_json",
    "curve_contexts",
    "describe",
    "describe_json",
    "fields",
    "seats_at",
    "seats_at_json",
]

COMMAND = "size"
# The positional argument (a config path or bundled name) is the page's "model" parameter.
MODEL_PARAM = "model"
# A pasted config is written here, relative to the working directory, and passed as a
# path: the model is then named "pasted", as `kvlib size pasted/config.json` names it.
PASTED_CONFIG = Path("pasted") / "config.json"
# Flags the page never sets: output format and help are the page's business.
_SKIPPED_DESTS = {"help", "json"}
# Seats are plotted at powers of two between these contexts (widened to the user's
# context and the model's max_position_embeddings).
_PLOT_MIN_TOKENS = 1024
_PLOT_MIN_SPAN_TOKENS = 32768


def _choices() -> dict[str, list[str]]:
    """Lists a field's value comes from, where kvlib defines the list."""
    dtypes = list(DTYPE_BITS)
    return {
        "config": bundled_models(),
        "kv_dtype": dtypes,
        "weight_dtype": dtypes,
        "gpu": gpu_names(),
    }


@functools.cache
def size_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``(root, size)``: a ``kvlib`` parser holding only the size command, registered by
    the command itself exactly as ``kvlib.cli.parser`` registers it. (The full CLI
    parser would import every command, some of which need numpy.) Built once: parsing
    does not change a parser."""
    root = argparse.ArgumentParser(prog="kvlib")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    size_command.register(commands)
    return root, commands.choices[COMMAND]


@dataclass(frozen=True)
class Field:
    """One input of the page: a flag of ``kvlib size`` (or its positional config)."""

    param: str  # name in the page's address (?context=32768)
    dest: str
    flag: str | None  # None for the positional config
    default: str  # as text; "" when the command has no default (flag not given)
    help: str
    choices: list[str] | None
    switch: bool  # a flag without a value (store_true)


@functools.cache
def fields() -> tuple[Field, ...]:
    """The size command's arguments, in the parser's order, read off the parser.

    argparse keeps no public list of a parser's arguments; ``_actions`` is the one it
    has used since it was added to the standard library.
    """
    _, size = size_parser()
    lists = _choices()
    found = []
    for action in size._actions:
        if action.dest in _SKIPPED_DESTS:
            continue
        flag = max(action.option_strings, key=len) if action.option_strings else None
        param = action.dest if flag else MODEL_PARAM
        default = "" if action.default is None else str(action.default)
        choices = lists.get(action.dest)
        if choices is not None and default and default not in choices:
            choices = [default, *choices]  # e.g. --weight-dtype auto
        if action.choices is not None:
            choices = [str(c) for c in action.choices]
        found.append(
            Field(param, action.dest, flag, default, action.help or "", choices, action.nargs == 0)
        )
    return tuple(found)


def describe() -> dict[str, Any]:
    """What the page needs to build its form."""
    return {
        "command": f"kvlib {COMMAND}",
        "pasted_config": PASTED_CONFIG.as_posix(),
        "fields": [asdict(f) for f in fields()],
    }


def describe_json() -> str:
    return json.dumps(describe())


class PageInputError(Exception):
    """The page's address or inputs name something the command has no flag for."""


def argv_for(params: dict[str, str], pasted: bool) -> list[str]:
    """The command line for the page's inputs; inputs left empty or at the default text
    are left out, so the command shows only what was chosen.

    ``--flag=value`` keeps a value such as ``-5`` from being read as a flag; the
    positional config follows ``--`` for the same reason.
    """
    known = {f.param: f for f in fields()}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise PageInputError(
            f"unknown parameter {unknown[0]!r} in the page address: use {', '.join(known)}"
        )
    argv = [COMMAND]
    for param, value in params.items():
        field = known[param]
        if field.flag is None or value in ("", field.default):
            continue
        if field.switch:
            if value.lower() in ("1", "true", "yes", "on"):
                argv.append(field.flag)
        else:
            argv.append(f"{field.flag}={value}")
    model = PASTED_CONFIG.as_posix() if pasted else params.get(MODEL_PARAM, "")
    return [*argv, "--", model] if model else argv


def display_command(argv: list[str]) -> str:
    """The command as a person would type it: the config first, then ``--flag value``."""
    command, rest = argv[0], argv[1:]
    positional: list[str] = []
    if "--" in rest:
        cut = rest.index("--")
        rest, positional = rest[:cut], rest[cut + 1 :]
    words = ["kvlib", command, *positional]
    for word in rest:
        words += word.split("=", 1)
    return shlex.join(words)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """Parse ``argv`` and run the command's handler: (exit status, stdout, stderr).

    argparse reports a bad argument by printing usage and the error and exiting with
    status 2, exactly as the CLI does; the SystemExit is caught here.
    """
    root, _ = size_parser()
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            args = root.parse_args(argv)
            status: int = args.handler(args)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 2
    return status, out.getvalue(), err.getvalue()


def error_field(message: str, params: dict[str, str]) -> str:
    """The input an error line is about: the flag it names (longest first), else the
    input whose value (other than its default) it quotes, else the model: errors in a
    config name no flag."""
    by_flag = sorted((f for f in fields() if f.flag), key=lambda f: -len(f.flag or ""))
    for field in by_flag:
        if re.search(rf"(?<![\w-]){re.escape(field.flag or '')}(?![\w-])", message):
            return field.param
    defaults = {f.param: f.default for f in fields()}
    for param, value in params.items():
        if value and value != defaults.get(param) and repr(value) in message:
            return param
    return MODEL_PARAM


def _plot_contexts(context: int, max_position: int | None) -> list[int]:
    """Powers of two covering the model's trained context and the user's, and the
    user's context itself."""
    low = min(_PLOT_MIN_TOKENS, 1 << (context.bit_length() - 1))
    high = max(context, max_position or 0, _PLOT_MIN_SPAN_TOKENS)
    top = 1 << math.ceil(math.log2(high))
    points = {context}
    tokens = low
    while tokens <= top:
        points.add(tokens)
        tokens *= 2
    return sorted(points)


def curve_contexts(argv: list[str], report: dict[str, Any]) -> list[int] | None:
    """Contexts at which the page plots seats, or None when the report has no seats
    (no GPU and no --kv-memory)."""
    if report.get("seats") is None:
        return None
    max_position = load_config(argv[-1]).max_position_embeddings
    return _plot_contexts(int(report["context_tokens"]), max_position)


def seats_at(argv: list[str], context_tokens: int) -> int | None:
    """The seats ``kvlib size`` reports for ``argv`` with its context set to
    ``context_tokens``, everything else unchanged (one point of the seats curve)."""
    base = [word for word in argv if not word.startswith("--context=")]
    cut = base.index("--")
    command = [*base[:cut], f"--context={context_tokens}", "--json", *base[cut:]]
    status, out, err = run_cli(command)
    if status != 0:
        raise RuntimeError(f"{display_command(command)} failed: {err.strip()}")
    seats: int | None = json.loads(out)["seats"]
    return seats


_COLUMNS = re.compile(r"\s{2,}")


def table_rows(table: str) -> list[list[str]]:
    """The command's text table as ``[label, value]`` rows for the page's HTML table.

    Each line of ``kvlib size`` is a label, two or more spaces, and the value (the
    value itself may hold single spaces); the text is split, never recomputed.
    """
    rows = []
    for line in table.splitlines():
        if not line.strip():
            continue
        parts = _COLUMNS.split(line.strip(), maxsplit=1)
        rows.append([parts[0], parts[1] if len(parts) > 1 else ""])
    return rows


def compute(params: dict[str, str], pasted: str | None = None) -> dict[str, Any]:
    """Run ``kvlib size`` on the page's inputs.

    ``params``: the page's parameters as text (``{"model": "Llama-3.1-70B",
    "context": "32768", ...}``). ``pasted``: the text of a pasted config.json, used
    instead of ``params["model"]``. Returns ``{"status": 0, "json", "table", "rows",
    "command", "plot"}`` or ``{"status": 2, "error": the CLI's error line, "field"}``.
    """
    if pasted is not None:
        PASTED_CONFIG.parent.mkdir(parents=True, exist_ok=True)
        PASTED_CONFIG.write_text(pasted, encoding="utf-8")
    try:
        argv = argv_for(params, pasted is not None)
    except PageInputError as exc:
        return {"status": 2, "error": str(exc), "field": "", "command": ""}
    command = display_command(argv)
    status, out, err = run_cli([*argv[:1], "--json", *argv[1:]])
    if status != 0:
        lines = err.strip().splitlines() or [f"kvlib {COMMAND}: error (status {status})"]
        return {
            "status": status,
            "error": lines[-1],
            "field": error_field(lines[-1], params),
            "command": command,
        }
    table_status, table, _ = run_cli(argv)
    if table_status != 0:
        raise RuntimeError(f"{command} printed JSON but no table")
    return {
        "status": 0,
        "json": out.strip(),
        "table": table.rstrip("\n"),
        "rows": table_rows(table),
        "command": command,
        "argv": argv,
        "curve_contexts": curve_contexts(argv, json.loads(out)),
    }


def compute_json(request: str) -> str:
    """:func:`compute` on ``{"params": {...}, "pasted": text | null}``, as JSON."""
    data = json.loads(request)
    params = {str(k): str(v) for k, v in data.get("params", {}).items()}
    return json.dumps(compute(params, data.get("pasted")))


def seats_at_json(argv: str, context_tokens: int) -> str:
    """:func:`seats_at` with ``argv`` as a JSON list, as JSON."""
    return json.dumps(seats_at([str(w) for w in json.loads(argv)], int(context_tokens)))
