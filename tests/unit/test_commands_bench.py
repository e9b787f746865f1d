"""kvlib bench: reports that say what ran where, rates that follow from the median,
agreement with an independent copy timing, one-line errors for bad input, and a table
that says where a figure was measured and what it counts."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import timeit
from typing import Any

import numpy as np
import pytest
import torch

from kvlib.cli import main
from kvlib.commands.bench import COPY_COUNTING, CopyReport, MatmulReport, render
from kvlib.hardware import get_gpu
from kvlib.timing import roofline
from kvlib.timing.devices import cpu_model_name

FAST = ["--rep-ms", "20", "--warmup-ms", "5"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def bench_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["bench", *args, "--json", "--device", "cpu"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_copy_report_counts_read_and_write(capsys: pytest.CaptureFixture[str]) -> None:
    report = bench_json(capsys, "copy", "--bytes", "1 MiB", *FAST)
    assert report["device"] == "cpu" and report["clock"] == "perf_counter_ns"
    assert cpu_model_name() in report["device_name"]
    assert report["bytes_copied"] == 2**20 and isinstance(report["bytes_moved"], int)
    assert report["bytes_moved"] == roofline.copy_bytes_moved(2**20) == 2 * 2**20
    assert "read + write" in report["bytes_counted"]
    assert report["bandwidth_bytes_per_s"] == pytest.approx(
        report["bytes_moved"] / report["median_s"]
    )
    assert report["p20_s"] <= report["median_s"] <= report["p80_s"]
    assert report["min_s"] <= report["p20_s"]
    assert report["cache"] == "cold" and report["flush_bytes"] > 0
    assert report["datasheet_gpu"] is None  # a CPU has no row in kvlib.hardware


def test_copy_agrees_with_an_independent_copy_timing(capsys: pytest.CaptureFixture[str]) -> None:
    """``kvlib bench copy`` against numpy's ``copyto`` timed by ``timeit``, same machine.

    64 MiB: source and destination together are four times a typical server
    last-level cache, so both copies stream from memory, and neither flushes.
    Two different copy loops and two timers, interleaved over nine rounds, each
    side's fastest copy compared: on a shared machine a copy is only ever slowed
    down, so the fastest of many is the one least disturbed (medians of single
    rounds ranged from 0.45 to 1.9 with five test processes on two cores).
    Two correct copies may still differ by 1.5x: a store that first reads the
    destination line (write-allocate) moves 3 N bytes where a non-temporal store
    moves 2 N, and which one a library picks at 64 MiB depends on the CPU's
    cache size (a CI machine measured torch 1.50x faster than numpy's memcpy).
    The bounds, 0.5 to 2.0, allow that and still fail a timing that misses the
    copy (an unsynchronised or lazily evaluated call, orders of magnitude faster)
    or one that includes allocation and page faults (well under 0.5).

    Under heavy load one set of nine rounds still measured 0.42 once. A flaw in the
    harness is systematic and shows in every set; load is not. So up to three sets
    are measured, and the test passes on the first inside the bounds.
    """
    n = 64 * 2**20
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages before timing
    ratios = []
    for _ in range(3):
        ours_s, theirs_s = [], []
        for _ in range(9):
            ours = bench_json(capsys, "copy", "--bytes", str(n), "--cache", "warm",
                              "--rep-ms", "30")
            assert ours["bandwidth_bytes_per_s"] == pytest.approx(2 * n / ours["median_s"])
            ours_s.append(ours["min_s"])
            theirs_s += timeit.repeat(lambda: np.copyto(dst, src), number=1, repeat=5)
        ratios.append(min(theirs_s) / min(ours_s))  # our bandwidth over numpy's, at best
        if 0.5 < ratios[-1] < 2.0:
            break
    assert 0.5 < ratios[-1] < 2.0, ratios


def test_matmul_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = bench_json(capsys, "matmul", "--m", "64", "--n", "96", "--k", "128", *FAST)
    assert (report["m"], report["n"], report["k"], report["dtype"]) == (64, 96, 128, "fp32")
    assert report["flops"] == 2 * 64 * 96 * 128
    assert report["bytes_moved"] == 4 * (64 * 128 + 128 * 96 + 64 * 96)
    assert report["flops_per_s"] == pytest.approx(report["flops"] / report["median_s"])
    assert report["arithmetic_intensity_flops_per_byte"] == pytest.approx(
        report["flops"] / report["bytes_moved"]
    )
    assert report["datasheet_flops_per_s"] is None


def test_decode_report(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--batch", "2", "--context", "256", "--heads", "8", "--kv-heads", "2"]
    report = bench_json(capsys, "decode", *args, "--head-dim", "32", "--impl", "matmul", *FAST)
    k = torch.empty(2, 2, 256, 32)  # (B, H_kv, T, d) in fp32, as the CPU default
    assert report["kv_cache_bytes"] == 2 * k.nbytes
    assert report["bytes_moved"] == 2 * k.nbytes + 2 * torch.empty(2, 8, 1, 32).nbytes
    assert report["flops"] == 4 * 2 * 8 * 256 * 32
    assert report["impl"] == "matmul" and report["dtype"] == "fp32"
    # Each KV head serves 4 query heads: 2 x 4 / 4 bytes = 2 FLOPs per cache byte, nearly.
    assert report["arithmetic_intensity_flops_per_byte"] == pytest.approx(2.0, rel=0.02)


def test_human_report_names_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "copy", "--bytes", "1 MiB", "--device", "cpu", *FAST]) == 0
    out = capsys.readouterr().out
    assert cpu_model_name() in out and "a CPU measurement" in out
    assert "read + write" in out and "GB/s" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["copy", "--bytes", "12 parsecs"], "--bytes"),
        (["copy", "--bytes", "0"], "--bytes"),
        (["copy", "--cache", "lukewarm"], "--cache"),
        (["copy", "--rep-ms", "soon"], "--rep-ms"),
        (["copy", "--device", "tpu"], "tpu"),
        (["decode", "--heads", "30", "--kv-heads", "8"], "--kv-heads"),
        (["decode", "--batch", "two"], "--batch"),
        (["decode", "--impl", "flash"], "--impl"),
        (["matmul", "--dtype", "int4"], "--dtype"),
        (["matmul", "--m", "-3"], "--m"),
    ],
)
def test_bad_input_is_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and needle in lines[0]


def test_bad_input_from_the_command_line_fails_before_torch_loads() -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kvlib", "bench", "decode", "--batch", "0"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    errors = [ln for ln in result.stderr.splitlines() if not ln.startswith("import time:")]
    assert errors == ["kvlib bench: error: --batch must be at least 1, got 0"]
    assert not re.search(r"\|\s+torch\b", result.stderr)  # no ~3 s import of torch first


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "copy", "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_allocation_failure_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    big = str(2**40)  # 1 TiB of float32 per operand: more than this machine holds
    assert main(["bench", "matmul", "--m", big, "--n", "2", "--k", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smaller sizes" in err[0]


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, kvlib.commands.bench, kvlib.timing.roofline, kvlib.timing, "
        "kvlib.timing.workloads, course.book.gpu_runs; "
        "print(sorted({'torch', 'numpy', 'tqdm'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


H100 = get_gpu("H100-SXM")


def _common(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "workload": "copy",
        "description": "device-to-device copy of 1 GiB",
        "device": "cuda:0",
        "device_name": "NVIDIA H100 80GB HBM3",
        "clock": "cuda-events",
        "cache": "cold",
        "flush_bytes": 100 * 2**20,
        "reps": 200,
        "median_s": 0.8e-3,
        "p20_s": 0.79e-3,
        "p80_s": 0.81e-3,
        "min_s": 0.78e-3,
        "resolution_limited": False,
        "bytes_moved": 2 * 2**30,
        "bandwidth_bytes_per_s": 2 * 2**30 / 0.8e-3,
        "datasheet_gpu": H100.name,
        "datasheet_bandwidth_bytes_per_s": H100.hbm_bandwidth_bytes_per_s,
    }
    fields.update(overrides)
    return fields


def _rows(text: str) -> dict[str, str]:
    return {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()}


def test_copy_table_gives_the_share_of_the_datasheet_and_the_counting() -> None:
    report = CopyReport(**_common(), bytes_copied=2**30, bytes_counted=COPY_COUNTING)
    rows = _rows(render(report))
    share = report.bandwidth_bytes_per_s / H100.hbm_bandwidth_bytes_per_s
    assert rows["device"] == "cuda:0: NVIDIA H100 80GB HBM3"
    assert f"({share:.0%} of the H100-SXM datasheet's" in rows["bandwidth"]
    assert "read + write" in rows["traffic"] and f"{2 * 2**30:,} bytes moved" in rows["traffic"]
    assert "200 repetitions, cold cache, 100 MiB written before each" in rows["clock"]
    assert "median" in rows and "800 us" in rows["median"]
    assert "note" not in rows and "warning" not in rows


def test_cpu_tables_say_so_and_short_medians_are_flagged() -> None:
    fields = _common(device="cpu", device_name="AMD EPYC (1 torch thread)",
                     clock="perf_counter_ns", datasheet_gpu=None,
                     datasheet_bandwidth_bytes_per_s=None, resolution_limited=True)
    rows = _rows(render(CopyReport(**fields, bytes_copied=2**30, bytes_counted=COPY_COUNTING)))
    assert "a CPU measurement" in rows["note"]
    assert "under 100 clock ticks" in rows["warning"]
    assert "datasheet" not in rows["bandwidth"]


def test_matmul_table_compares_with_the_dense_peak_only() -> None:
    flops = 2 * 8192**3
    report = MatmulReport(
        **_common(workload="matmul", median_s=2e-3),
        flops=flops, flops_per_s=flops / 2e-3, arithmetic_intensity_flops_per_byte=2730.7,
        datasheet_flops_per_s=H100.bf16_dense_flops_per_s, m=8192, n=8192, k=8192,
        dtype="bf16",
    )
    rows = _rows(render(report))
    share = flops / 2e-3 / H100.bf16_dense_flops_per_s
    assert f"({share:.0%} of the H100-SXM datasheet's dense bf16" in rows["compute"]
    assert rows["intensity"].startswith("2.73e+03 FLOPs per byte")
    unknown = dataclasses.replace(report, datasheet_flops_per_s=None)
    assert "datasheet" not in _rows(render(unknown))["compute"]
