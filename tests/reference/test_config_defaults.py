"""kvlib/data/config_defaults.json: the transformers defaults kvlib fills in, as current as
the pinned transformers release (``scripts/gen_config_defaults.py --check``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.reference


def test_bundled_transformers_defaults_are_current() -> None:
    script = ROOT / "scripts" / "gen_config_defaults.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
