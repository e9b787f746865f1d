"""kvlib.commands.bench_render: the table says where a figure was measured and what it counts."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvlib.commands.bench_render import COPY_COUNTING, CopyReport, MatmulReport, render
from kvlib.hardware import get_gpu

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
