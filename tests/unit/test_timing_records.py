"""kvlib.timing.records: a run's JSON read back, and only if a GPU timed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvlib.timing import TimingResult, records
from kvlib.timing.workloads import Workload


def _record(clock: str = "cuda-events", device: str = "cuda:0") -> dict[str, Any]:
    result = TimingResult(device, "a GPU", clock, "cold", 100, 3, 5, 5e-7,
                          (2e-3, 1e-3, 3e-3, 4e-3, 5e-3))  # fmt: skip
    workload = Workload("copy", lambda: None, 2000, 0, "copy of 1,000 bytes")
    return records.measurement_record("copy/1000", workload, result, {"bytes_copied": 1000})


def _doc(**changes: Any) -> dict[str, Any]:
    doc = {
        "schema": records.SCHEMA,
        "date": "2026-01-02T03:04:05+00:00",
        "device": {"type": "cuda", "name": "a GPU", "driver": "1.2"},
        "datasheet": {"gpu": "H200"},
        "measurements": [_record()],
        "summary": {"goal_met": False},
    }
    doc.update(changes)
    return doc


def test_record_carries_the_statistics() -> None:
    record = _record()
    assert record["median_s"] == 3e-3 and record["min_s"] == 1e-3
    assert record["p20_s"] == pytest.approx(1.8e-3) and record["p80_s"] == pytest.approx(4.2e-3)
    assert record["bandwidth_bytes_per_s"] == pytest.approx(2000 / 3e-3)
    assert record["clock"] == "cuda-events" and record["cache"] == "cold"


def test_round_trip(tmp_path: Path) -> None:
    (tmp_path / "gpu_a.json").write_text(json.dumps(_doc()))
    (tmp_path / "gpu_b.json").write_text(json.dumps(_doc(date="2025-12-31T00:00:00+00:00")))
    (tmp_path / "notes.json").write_text("{}")  # not matched by gpu_*.json
    runs = records.load_runs(tmp_path)
    assert [r.date[:4] for r in runs] == ["2025", "2026"]
    run = runs[0]
    assert run.device_name == "a GPU" and run.driver == "1.2" and run.datasheet_gpu == "H200"
    (m,) = run.named("copy")
    assert m.median_s == 3e-3 and m.bytes_moved == 2000 and m.settings == {"bytes_copied": 1000}
    assert records.load_runs(tmp_path / "empty") == []


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (_doc(schema="other"), "schema"),
        (_doc(device={"type": "cpu", "name": "x"}), "not 'cuda'"),
        (_doc(measurements=[_record(clock="perf_counter_ns", device="cpu")]), "CPU time"),
        (_doc(measurements=[]), "no measurements"),
        (_doc(measurements=[{**_record(), "median_s": float("nan")}]), "median_s"),
        (_doc(measurements=[{k: v for k, v in _record().items() if k != "flops"}]), "'flops'"),
    ],
)
def test_refusals_name_the_field(tmp_path: Path, doc: dict[str, Any], match: str) -> None:
    path = tmp_path / "gpu_x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match):
        records.read_run(path)


def test_summary_rows_and_points(tmp_path: Path) -> None:
    matmul = {**_record(), "name": "matmul/8", "flops": 6000, "flops_per_s": 2e6}
    summary = {"copy_bandwidth_bytes_per_s": 4.1e12, "matmul_peak_flops_per_s": 7.5e14,
               "measured_ridge_flops_per_byte": 182.9, "kv_read_over_copy": 0.93,
               "goal_kv_read_over_copy": 0.9, "goal_met": True}  # fmt: skip
    (tmp_path / "gpu_a.json").write_text(
        json.dumps(_doc(measurements=[_record(), matmul], summary=summary))
    )
    (run,) = records.load_runs(tmp_path)
    rows = dict(records.summary_rows(run))
    assert rows["device"] == "a GPU" and rows["driver"] == "1.2"
    assert rows["copy bandwidth (2N / median)"] == "4.1 TB/s"
    assert rows["measured ridge point"] == "183 FLOPs/B"
    assert rows["bf16 matmul"] == "750 TFLOP/s"
    assert rows["KV read / copy"] == "93.0% (goal 90%: met)"
    assert "read bandwidth" not in rows  # absent from the summary, absent from the table
    assert records.roofline_points(run) == [("matmul/8", 3.0, 2e6)]


def test_the_gpu_page_shows_a_committed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code of book/06_timing/06_gpu_runs.md, run on a folder holding one run.

    No GPU run is committed yet, so the page's plotting branch does not execute
    when the book is built; this runs it on a test file instead.
    """
    import re

    import matplotlib

    matplotlib.use("Agg")
    page = Path(__file__).resolve().parents[2] / "book" / "06_timing" / "06_gpu_runs.md"
    cells = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", page.read_text(), re.S)
    matmul = {**_record(), "name": "matmul/8", "flops": 6000, "flops_per_s": 2e6}
    decode = {**_record(), "name": "decode/1x8192", "flops": 500, "flops_per_s": 1e5}
    summary = {"memory_ceiling_bytes_per_s": 1e6, "matmul_peak_flops_per_s": 5e6,
               "measured_ridge_flops_per_byte": 5.0}  # fmt: skip
    data = tmp_path / "book" / "data"
    data.mkdir(parents=True)
    (data / "gpu_test.json").write_text(
        json.dumps(_doc(measurements=[_record(), matmul, decode], summary=summary))
    )
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "scripts").symlink_to(page.parents[2] / "scripts")  # the page reads gpu_check
    monkeypatch.chdir(tmp_path / "book")
    glued: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    for cell in cells:
        source = "\n".join(line for line in cell.splitlines() if not line.startswith(":tags:"))
        exec(source, namespace)
        namespace["glue"] = lambda key, value, display=True: glued.__setitem__(key, value)
    assert [r.device_name for r in namespace["runs"]] == ["a GPU"]
    assert glued["ch6_gpu_status"].startswith("This page shows 1 GPU run(s): a GPU (2026-01-02)")
    assert glued["ch6_gpu_goal"] == "90%" and "GiB" in glued["ch6_gpu_kv"]


def _named(name: str, bandwidth: float = 0.0, flops: float = 0.0) -> dict[str, Any]:
    return {"name": name, "bandwidth_bytes_per_s": bandwidth, "flops_per_s": flops}


def test_summary_of_a_run() -> None:
    measurements = [
        _named("copy/1024", 1.0e12),
        _named("copy/4096", 2.0e12),
        _named("read", 2.5e12),
        _named("kv-read/sdpa", 1.7e12),
        _named("kv-read/matmul", 1.9e12),
        _named("matmul-peak", 0.0, 5.0e14),
    ]
    summary = records.summarise(measurements, "copy/4096", goal=0.9)
    assert summary["best_kv_read"] == "kv-read/matmul"
    assert summary["kv_read_over_copy"] == pytest.approx(1.9 / 2.0)
    assert summary["goal_met"] is True
    # The memory ceiling is the faster stream (the read here), the ridge peak over it.
    assert summary["memory_ceiling_bytes_per_s"] == 2.5e12
    assert summary["measured_ridge_flops_per_byte"] == pytest.approx(200.0)
    missed = records.summarise(measurements[:2] + measurements[3:4], "copy/4096", goal=0.9)
    assert missed["goal_met"] is False and missed["matmul_peak_flops_per_s"] is None
    assert "measured_ridge_flops_per_byte" not in missed
