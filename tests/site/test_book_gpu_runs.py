"""course.book.gpu_runs: a run's JSON read back, partial or whole, and only if a GPU timed it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from course.book import gpu_runs as records
from kvlib.timing import TimingResult
from kvlib.timing.workloads import Kernel

ROOT = Path(__file__).resolve().parents[2]


def _record(clock: str = "cuda-events", device: str = "cuda:0") -> dict[str, Any]:
    result = TimingResult(
        device, "a GPU", clock, "cold", 100, 3, 5, 5e-7, (2e-3, 1e-3, 3e-3, 4e-3, 5e-3)
    )
    workload = Kernel("copy", lambda: None, 2000, 0, "copy of 1,000 bytes")
    return records.measurement_record("copy/1000", workload, result, {"bytes_copied": 1000})


def _doc(**changes: Any) -> dict[str, Any]:
    doc = {
        "schema": records.SCHEMA,
        "rehearsal": False,
        "status": "complete",
        "date": "2026-01-02T03:04:05+00:00",
        "device": {"type": "cuda", "name": "a GPU", "driver": "1.2"},
        "datasheet": {"gpu": "H200"},
        "sections": {
            "preflight": {"status": "ok", "elapsed_s": 0.5},
            "bandwidth": {"status": "ok", "elapsed_s": 3.0},
        },
        "measurements": [_record()],
        "summary": {},
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
        (_doc(rehearsal=True), "rehearsal"),
        ({k: v for k, v in _doc().items() if k != "rehearsal"}, "rehearsal"),
        (_doc(sections=[]), "sections"),
        (_doc(sections={"bandwidth": {"status": "done"}}), "'status'"),
        (_doc(measurements=[{**_record(), "median_s": float("nan")}]), "median_s"),
        (_doc(measurements=[{k: v for k, v in _record().items() if k != "flops"}]), "'flops'"),
    ],
)
def test_refusals_name_the_field(tmp_path: Path, doc: dict[str, Any], match: str) -> None:
    path = tmp_path / "gpu_x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match):
        records.read_run(path)


def test_a_partial_run_is_read_with_its_failures(tmp_path: Path) -> None:
    sections = {
        "preflight": {"status": "ok"},
        "bandwidth": {
            "status": "failed",
            "elapsed_s": 1.25,
            "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory"},
        },
        "kv_read": {"status": "skipped", "reason": "time budget spent (--budget-s)"},
        "compute": {"status": "running"},
        "agreement": {"status": "pending"},
    }
    failed = [{"name": "copy/4294967296", "type": "OutOfMemoryError", "message": "no memory"}]
    doc = _doc(status="running", sections=sections, measurements=[], failed_measurements=failed)
    (tmp_path / "gpu_a.json").write_text(json.dumps(doc))
    (run,) = records.load_runs(tmp_path)
    assert not run.complete and run.measurements == () and run.failed_measurements[0] == failed[0]
    assert records.section_rows(run) == [
        ("preflight", "ok", ""),
        ("bandwidth", "failed", "OutOfMemoryError: CUDA out of memory"),
        ("kv_read", "skipped", "time budget spent (--budget-s)"),
        ("compute", "running", ""),
        ("agreement", "pending", ""),
    ]
    assert [s.name for s in run.with_status("failed")] == ["bandwidth"]
    assert run.sections[1].elapsed_s == 1.25
    rows = dict(records.summary_rows(run))
    assert rows["run"] == (
        "stopped early (running); sections: 1 pending, 1 running, 1 ok, 1 failed, 1 skipped"
    )
    assert "copy bandwidth (2N / median)" not in rows and records.kv_read_bars(run) == []


def test_summary_rows_and_points(tmp_path: Path) -> None:
    matmul = {**_record(), "name": "matmul/8", "flops": 6000, "flops_per_s": 2e6}
    summary = {
        "copy_bandwidth_bytes_per_s": 4.1e12,
        "matmul_peak_flops_per_s": 7.5e14,
        "measured_ridge_flops_per_byte": 182.9,
        "kv_read_over_copy": 0.93,
        "kv_read_over_read": 0.89,
        "paged_over_contiguous": 0.412,
        "goal_kv_read_over_stream": 0.9,
    }
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
    assert rows["KV read / read"] == "89.0% (goal 90%: not met)"
    assert rows["paged / contiguous KV read"] == "41.2%"
    assert rows["run"] == "complete; sections: 2 ok"
    assert "read bandwidth" not in rows  # absent from the summary, absent from the table
    assert records.roofline_points(run) == [("matmul/8", 3.0, 2e6)]


def _page_runs(tmp_path: Path) -> Path:
    """A repository root holding two runs: a complete one and one cut short."""

    def named(name: str, bandwidth: float, flops: int = 0) -> dict[str, Any]:
        return {
            **_record(),
            "name": name,
            "bandwidth_bytes_per_s": bandwidth,
            "flops": flops,
            "flops_per_s": flops / 3e-3,
        }

    measurements = [
        named("copy/1000", 4.0e12),
        named("read", 4.4e12),
        named("kv-read/sdpa", 4.1e12, 500),
        named("kv-read/matmul", 3.2e12, 500),
        named("kv-read-paged/16", 1.5e12, 500),
        named("matmul/8", 1e9, 6000),
        named("decode/1x8192", 4e12, 500),
    ]
    summary = records.summarise(measurements, "copy/1000", goal=0.9)
    summary.update(
        matmul_peak_flops_per_s=5e6,
        memory_ceiling_bytes_per_s=1e6,
        measured_ridge_flops_per_byte=5.0,
    )
    data = tmp_path / "book" / "data"
    data.mkdir(parents=True)
    (data / "gpu_complete.json").write_text(
        json.dumps(_doc(measurements=measurements, summary=summary))
    )
    cut = {
        "preflight": {"status": "ok"},
        "bandwidth": {
            "status": "failed",
            "error": {"type": "CalledProcessError", "message": "cc failed"},
        },
        "kv_read": {"status": "interrupted", "reason": "Interrupted: signal 15"},
    }
    (data / "gpu_partial.json").write_text(
        json.dumps(
            _doc(
                date="2026-02-01T00:00:00+00:00",
                status="interrupted",
                sections=cut,
                measurements=[],
                summary={},
            )
        )
    )
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")  # the page reads gpu_check
    return tmp_path


def _cell_code(cell: str) -> str:
    """A MyST code cell's code: its options dropped, written as ``:key: value`` lines or as
    a YAML block between ``---`` lines."""
    lines = cell.splitlines()
    if lines and lines[0] == "---":
        lines = lines[lines.index("---", 1) + 1 :]
    while lines and re.match(r":[\w-]+:", lines[0]):
        lines = lines[1:]
    return "\n".join(lines)


def test_the_gpu_page_shows_complete_and_partial_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code of book/06_timing/06_gpu_runs.md, run on a folder holding two runs.

    No GPU run is committed yet, so the page's per-run branches do not execute
    when the book is built; this runs them on test files instead.
    """
    import IPython.display
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    page = ROOT / "book" / "06_timing" / "06_gpu_runs.md"
    cells = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", page.read_text(), re.S)
    monkeypatch.chdir(_page_runs(tmp_path) / "book")
    shown: list[Any] = []
    figures: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.setattr(plt, "show", lambda: figures.append(plt.gcf()))
    glued: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    for cell in cells:
        exec(_cell_code(cell), namespace)
        namespace["glue"] = lambda key, value, display=True: glued.__setitem__(key, value)
    assert [r.device_name for r in namespace["runs"]] == ["a GPU", "a GPU"]
    assert glued["ch6_gpu_status"] == (
        "This page shows 2 GPU run(s): a GPU (2026-01-02, complete), a GPU (2026-02-01, partial)."
    )
    assert glued["ch6_gpu_goal"] == "90%" and "GiB" in glued["ch6_gpu_kv"]
    assert glued["ch6_gpu_blocks"] == "16 and 64"
    # The sections table of the partial run names the failure and the interruption.
    partial = shown[1].data
    assert "CalledProcessError: cc failed" in partial and "interrupted" in partial
    # Two figures for the complete run (roofline, KV read); none for the partial one.
    assert len(figures) == 2
    kv = figures[1].axes[0]
    assert [t.get_text() for t in kv.get_yticklabels()] == [
        "kv-read/sdpa",
        "kv-read/matmul",
        "kv-read-paged/16",
    ]
    goal = [line for line in kv.get_lines() if "goal" in str(line.get_label())]
    assert goal[0].get_xdata()[0] == pytest.approx(0.9 * 4.4)  # 90% of the read, in TB/s


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
    assert summary["goal_met_vs_copy"] is True
    # Against the pure read stream, like with like, the same kernel misses the goal.
    assert summary["kv_read_over_read"] == pytest.approx(1.9 / 2.5)
    assert summary["goal_met_vs_read"] is False
    # The memory ceiling is the faster stream (the read here), the ridge peak over it.
    assert summary["memory_ceiling_bytes_per_s"] == 2.5e12
    assert summary["measured_ridge_flops_per_byte"] == pytest.approx(200.0)
    missed = records.summarise(measurements[:2] + measurements[3:4], "copy/4096", goal=0.9)
    assert missed["goal_met_vs_copy"] is False and missed["matmul_peak_flops_per_s"] is None
    assert "measured_ridge_flops_per_byte" not in missed and "kv_read_over_read" not in missed
    paged = records.summarise(
        [*measurements, _named("kv-read-paged/16", 0.95e12)], "copy/4096", goal=0.9
    )
    assert paged["best_paged_kv_read"] == "kv-read-paged/16"
    assert paged["paged_over_contiguous"] == pytest.approx(0.5)  # over the best contiguous


def test_the_read_reference_is_the_faster_read_and_paging_is_per_kernel() -> None:
    measurements = [
        _named("copy/4096", 2.0e12),
        _named("read", 2.5e12),
        _named("read-triton/4096x16w8", 4.0e12),
        _named("read-triton/8192x8w8", 3.0e12),
        _named("kv-read/sdpa", 3.0e12),
        _named("kv-read/triton", 3.6e12),
        _named("kv-read-paged/triton-16", 2.7e12),
        _named("kv-read-paged/flex-64", 1.5e12),
    ]
    summary = records.summarise(measurements, "copy/4096", goal=0.9)
    assert summary["read_reference"] == "read-triton/4096x16w8"
    assert summary["kv_read_over_read"] == pytest.approx(3.6 / 4.0)  # not 3.6 / 2.5
    by_kernel = summary["paged_over_contiguous_by_kernel"]
    assert by_kernel["kv-read-paged/triton-16"] == {"over": "kv-read/triton", "ratio": 0.75}
    # flex has no contiguous read of its own: it is held against SDPA's.
    assert by_kernel["kv-read-paged/flex-64"]["over"] == "kv-read/sdpa"
    assert by_kernel["kv-read-paged/flex-64"]["ratio"] == pytest.approx(0.5)


def test_every_repetition_and_the_flush_are_recorded() -> None:
    record = _record()
    assert record["times_s"] == [2e-3, 1e-3, 3e-3, 4e-3, 5e-3] and record["flush"] == "read"


def test_a_rehearsal_is_read_as_one_and_its_rows_name_every_outcome(tmp_path: Path) -> None:
    record = {**_record(), "output_check": {"checked": True, "max_abs_error": 0.004}}
    doc = _doc(rehearsal=True, measurements=[record],
               failed_measurements=[{"name": "kv-read/bad", "type": "OutputMismatch",
                                     "message": "differs"}],
               skipped=[{"name": "fp8/scaled-mm", "reason": "a CPU has no fp8 tensor cores"}])
    path = tmp_path / "rehearsal.json"
    path.write_text(json.dumps(doc))
    assert records.read_rehearsal(path)["rehearsal"] is True
    rows = records.measurement_rows(records.read_rehearsal(path))
    assert rows[0] == ("copy/1000", "2,000", "5 of 5", "matches (largest error 0.004)",
                       "timed (cold, flush reads)")
    assert rows[1][4] == "failed: OutputMismatch: differs"
    assert rows[2][4] == "skipped: a CPU has no fp8 tensor cores"
    path.write_text(json.dumps(_doc()))
    with pytest.raises(ValueError, match="not a rehearsal"):
        records.read_rehearsal(path)


def test_summary_rows_show_the_clocks_paging_and_agreement(tmp_path: Path) -> None:
    clocks = {"sm_mhz": 1980, "mem_mhz": 3201}
    results = {
        "warmup": {"clocks_before": {"sm_mhz": 345, "mem_mhz": 3201}, "clocks_after": clocks},
        "matmul_peak": {"first_tenth_median_s": 1.0e-3, "last_tenth_median_s": 1.05e-3,
                        "sustained_s": 3.0, "clocks_before": clocks, "clocks_after": clocks},
        "agreement": {"kv_read": {"over_do_bench_read_flush": 0.99,
                                  "over_do_bench_write_flush": 1.01}},
    }
    summary = {"paged_over_contiguous_by_kernel": {
        "kv-read-paged/triton-16": {"over": "kv-read/triton", "ratio": 0.9}}}
    path = tmp_path / "gpu_a.json"
    path.write_text(json.dumps(_doc(results=results, summary=summary)))
    rows = dict(records.summary_rows(records.read_run(path)))
    assert rows["clocks before / after warm-up"] == (
        "SM 345 MHz, memory 3201 MHz / SM 1980 MHz, memory 3201 MHz")
    assert rows["sustained matmul: last tenth / first tenth"].startswith("1.050 over 3.0 s")
    assert rows["kvlib / do_bench, kv read"] == (
        "0.990 (read flush), 1.010 (write flush, as do_bench)")
    assert rows["kv-read-paged/triton-16 / kv-read/triton"] == "90.0%"
