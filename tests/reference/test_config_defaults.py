"""kvlib/data/config_defaults.json: the transformers defaults kvlib fills in, as current as
the pinned transformers release (``scripts/gen_config_defaults.py --check``).

The check extracts afresh only when the file's fingerprint of what the extraction reads
(transformers' version and configuration sources, the script) or its own table digest no
longer matches; ``--check --full`` extracts always (half a minute)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_defaults.py"
BUNDLED = ROOT / "kvlib" / "data" / "config_defaults.json"

pytestmark = pytest.mark.reference

sys.path.insert(0, str(SCRIPT.parent))
import gen_config_defaults as gen  # noqa: E402


def test_bundled_transformers_defaults_are_current() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_edited_table_or_another_transformers_is_not_taken_as_current(
        tmp_path: Path) -> None:
    table = json.loads(BUNDLED.read_text())
    assert gen.unchanged(BUNDLED)
    edited = json.loads(json.dumps(table))
    edited["models"]["llama"]["num_attention_heads"] = 64  # a hand edit of one default
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    assert not gen.unchanged(tmp_path / "edited.json")
    other = {**table, "fingerprint": "0" * 64}  # written from another transformers
    other["table_sha256"] = gen.table_digest(other)
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert not gen.unchanged(tmp_path / "other.json")
    assert not gen.unchanged(tmp_path / "missing.json")
