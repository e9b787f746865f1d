"""kvlib size: the numbers it prints, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlib import params, sizing
from kvlib.cli import main
from kvlib.config import load_config
from kvlib.units import GiB


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["size", *args, "--json"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def test_json_fields_match_sizing(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Gemma-2-9B", "--context", "8192", "--kv-dtype", "fp8")
    cfg = load_config("Gemma-2-9B")
    assert report["kv_bytes_per_token"] == sizing.kv_bytes_per_token(cfg, "fp8")
    assert report["kv_bytes"] == sizing.kv_bytes(cfg, 8192, "fp8")
    assert isinstance(report["kv_bytes"], int)
    assert report["weight_bytes"] == params.weight_bytes(cfg)
    assert "seats" not in report


def test_seats_on_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Llama-3.1-8B", "--gpu", "H100-SXM", "--context", "32768")
    cfg = load_config("Llama-3.1-8B")
    free = int(80 * GiB * 0.9) - params.weight_bytes(cfg)
    assert report["free_kv_bytes_per_gpu"] == free
    assert report["seats"] == free // sizing.kv_bytes(cfg, 32768)
    assert report["fits"] is True


def test_kv_memory_reproduces_the_brief(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], brief_config: dict[str, object]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(brief_config))
    report = run_json(capsys, str(config), "--kv-memory", "9 GiB")
    assert report["kv_bytes_per_token"] == 163_840
    assert report["seats"] == 14


def test_weights_that_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Llama-3.1-70B", "--gpu", "L4")
    assert report["fits"] is False and report["seats"] == 0


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "Llama-3.1-8B", "--gpu", "H100-SXM"]) == 0
    out = capsys.readouterr().out
    assert "128 KiB" in out and "512 MiB" in out and "seats at 4,096 tokens" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no-such-model"], "bundled"),
        (["Llama-3.1-8B", "--kv-dtype", "fp9"], "--kv-dtype"),
        (["Llama-3.1-8B", "--context", "0"], "--context"),
        (["Llama-3.1-8B", "--gpu", "V100"], "V100"),
        (["Falcon-7B", "--gpu", "L4", "--tp", "2"], "tp=2"),
        (["Llama-3.1-8B", "--kv-memory", "nine gigs"], "--kv-memory"),
        (["Llama-3.1-8B", "--gpu", "H100", "--gpu-memory-utilization", "1.5"], "utilization"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvlib", "size", *args], capture_output=True, text=True
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


def test_import_kvlib_does_not_import_torch() -> None:
    code = "import sys, kvlib, kvlib.cli, kvlib.sizing; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False"
