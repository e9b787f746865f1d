"""scripts/gpu_check.py: refuses without a GPU; on a CPU, its code path runs at tiny sizes
and writes a file the book refuses to show as a GPU run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from kvlib.timing import records

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cpu_doc() -> Iterator[dict[str, Any]]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _script().run_checks("cpu", profile="tiny")
    torch.set_num_threads(before)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_refuses_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 2 and not out.exists()
    assert "no CUDA GPU" in result.stderr and "never records CPU times" in result.stderr
    assert "Traceback" not in result.stderr


def test_refuses_a_cpu_device_even_with_a_gpu(tmp_path: Path) -> None:
    assert _script().main(["--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_every_section_is_measured_with_its_settings(cpu_doc: dict[str, Any]) -> None:
    names = [m["name"] for m in cpu_doc["measurements"]]
    for prefix in ("copy/", "l2-probe/warm", "l2-probe/cold", "read", "kv-read/sdpa",
                   "kv-read/matmul", "decode/", "matmul/", "matmul-peak", "tiny/"):  # fmt: skip
        assert any(n.startswith(prefix) for n in names), prefix
    for m in cpu_doc["measurements"]:
        assert m["settings"] and m["median_s"] > 0 and m["device"] == "cpu"
        assert m["bandwidth_bytes_per_s"] == pytest.approx(m["bytes_moved"] / m["median_s"])
    # Backends this build of torch lacks are recorded as skipped, with the reason.
    kv_names = {n for n in names if n.startswith("kv-read/")}
    skipped = {s["name"] for s in cpu_doc["skipped"]}
    expected = {f"kv-read/{i}" for i in ("sdpa", "matmul", "sdpa-flash", "sdpa-efficient",
                                         "sdpa-cudnn")}  # fmt: skip
    assert kv_names | skipped == expected
    for key in ("date", "device", "harness", "agreement", "unsynchronised", "overhead"):
        assert key in cpu_doc


def test_summary_follows_from_the_measurements(cpu_doc: dict[str, Any]) -> None:
    by_name = {m["name"]: m for m in cpu_doc["measurements"]}
    summary = cpu_doc["summary"]
    copy = by_name["copy/2097152"]
    best = by_name[summary["best_kv_read"]]
    assert summary["copy_bandwidth_bytes_per_s"] == copy["bandwidth_bytes_per_s"]
    assert summary["kv_read_over_copy"] == pytest.approx(
        best["bandwidth_bytes_per_s"] / copy["bandwidth_bytes_per_s"]
    )
    assert summary["goal_met"] == (summary["kv_read_over_copy"] >= 0.9)
    ceiling = max(copy["bandwidth_bytes_per_s"], by_name["read"]["bandwidth_bytes_per_s"])
    assert summary["memory_ceiling_bytes_per_s"] == ceiling
    assert summary["measured_ridge_flops_per_byte"] == pytest.approx(
        by_name["matmul-peak"]["flops_per_s"] / ceiling
    )


def test_the_book_never_shows_a_cpu_run_as_a_gpu_run(
    cpu_doc: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "gpu_cpu-run.json"
    path.write_text(json.dumps(cpu_doc))
    with pytest.raises(ValueError, match="not 'cuda'"):
        records.load_runs(tmp_path)
    # Relabelling the device is not enough: every measurement says which clock timed it.
    forged = {**cpu_doc, "device": {**cpu_doc["device"], "type": "cuda"}}
    path.write_text(json.dumps(forged))
    with pytest.raises(ValueError, match="never shown as a GPU figure"):
        records.load_runs(tmp_path)


def test_default_output_is_under_book_data() -> None:
    out = _script().default_out("NVIDIA H200")
    assert out == ROOT / "book" / "data" / "gpu_nvidia-h200.json"
