"""kvlib.cli: dispatch to the subcommands, and a light import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvlib.cli import main, parser


def test_every_subcommand_is_registered() -> None:
    commands = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"size", "grade"} <= set(commands)


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_import_kvlib_does_not_import_torch() -> None:
    code = "import sys, kvlib, kvlib.cli, kvlib.sizing; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False"
