"""kvlib.cli: dispatch to the subcommands, and a light import."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import kvlib.cli
from kvlib.cli import ENTRY_POINT_GROUP, main, parser

ROOT = Path(__file__).resolve().parents[2]


def _choices(root: argparse.ArgumentParser) -> set[str]:
    return set(root._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_every_subcommand_is_registered() -> None:
    assert {"size", "bench", "queue"} <= _choices(parser())


def test_other_packages_add_commands_through_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The course's ``kvlib grade`` arrives as a ``kvlib.commands`` entry point, the one
    that ``pyproject.toml`` declares: kvlib itself imports no course module."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    target = declared["project"]["entry-points"][ENTRY_POINT_GROUP]["grade"]
    assert target == "course.apps.grade_command:register"
    point = importlib.metadata.EntryPoint("grade", target, ENTRY_POINT_GROUP)

    def entry_points(**kwargs: Any) -> list[importlib.metadata.EntryPoint]:
        return [point] if kwargs.get("group") == ENTRY_POINT_GROUP else []

    monkeypatch.setattr(kvlib.cli.importlib.metadata, "entry_points", entry_points)
    assert "grade" in _choices(parser())


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_import_kvlib_does_not_import_torch() -> None:
    code = "import sys, kvlib, kvlib.cli, kvlib.sizing; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False"


def test_kvlibs_own_commands_skip_the_entry_point_scan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scanning every installed package's metadata costs tens of milliseconds a run: only
    a command kvlib does not have looks there, and then runs what it finds."""
    scans: list[str] = []

    def register(commands: Any) -> None:
        extra = commands.add_parser("extra")
        extra.set_defaults(handler=lambda args: 7)

    def entry_points(**kwargs: Any) -> list[Any]:
        scans.append(kwargs.get("group", ""))
        point = importlib.metadata.EntryPoint("extra", "x:y", ENTRY_POINT_GROUP)
        monkeypatch.setattr(importlib.metadata.EntryPoint, "load", lambda self: register)
        return [point]

    monkeypatch.setattr(kvlib.cli.importlib.metadata, "entry_points", entry_points)
    assert main(["size", "GPT-2", "--json"]) == 0
    capsys.readouterr()
    assert scans == []
    assert main(["extra"]) == 7
    assert scans == [ENTRY_POINT_GROUP]
