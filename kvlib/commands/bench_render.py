"""The reports of ``kvlib bench`` and their human-readable table.

A :class:`BenchReport` says where and how a workload was timed and its median;
each workload adds its own fields (``--json`` prints them all). Byte counts are
the minimum traffic: a copy of N bytes moves 2N (read + write, STREAM's
convention); attention reads the cached K and V once.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.units import format_bytes, format_flops, format_rate

__all__ = ["COPY_COUNTING", "BenchReport", "CopyReport", "DecodeReport", "MatmulReport", "render"]

COPY_COUNTING = "read + write: bytes_moved = 2 x bytes_copied"


@dataclass(frozen=True)
class BenchReport:
    """What every measurement reports: where and how it was timed, and the median."""

    workload: str
    description: str
    device: str
    device_name: str
    clock: str
    cache: str
    flush_bytes: int
    reps: int
    median_s: float
    p20_s: float
    p80_s: float
    min_s: float
    resolution_limited: bool
    bytes_moved: int
    bandwidth_bytes_per_s: float
    datasheet_gpu: str | None
    datasheet_bandwidth_bytes_per_s: float | None


@dataclass(frozen=True)
class CopyReport(BenchReport):
    """A device-to-device copy; ``bandwidth_bytes_per_s`` counts read + write (``2 N``)."""

    bytes_copied: int
    bytes_counted: str


@dataclass(frozen=True)
class MatmulReport(BenchReport):
    """``(m x k) @ (k x n)``: ``2 m n k`` FLOPs."""

    m: int
    n: int
    k: int
    dtype: str
    flops: int
    flops_per_s: float
    arithmetic_intensity_flops_per_byte: float
    datasheet_flops_per_s: float | None


@dataclass(frozen=True)
class DecodeReport(BenchReport):
    """One decode step of attention over a batch's KV cache."""

    batch: int
    context_tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    impl: str
    kv_cache_bytes: int
    flops: int
    flops_per_s: float
    arithmetic_intensity_flops_per_byte: float


def _duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:,.3g} {unit}"
    return f"{seconds / 1e-9:,.3g} ns"


def render(report: BenchReport) -> str:
    """The human-readable table of a bench report."""
    where = f"{report.device}: {report.device_name}"
    flushed = (
        f", {format_bytes(report.flush_bytes)} written before each" if report.flush_bytes else ""
    )
    rows = [
        ("device", where),
        ("workload", report.description),
        ("clock", f"{report.clock}, {report.reps} repetitions, {report.cache} cache{flushed}"),
        ("median", f"{_duration(report.median_s)} (p20 {_duration(report.p20_s)}, "
                   f"p80 {_duration(report.p80_s)}, min {_duration(report.min_s)})"),
    ]
    if report.resolution_limited:
        rows.append(("warning", "the median is under 100 clock ticks: time a larger workload"))
    moved = f"{report.bytes_moved:,} bytes moved"
    if isinstance(report, CopyReport):
        moved += f" ({report.bytes_counted})"
    rows.append(("traffic", moved))
    bandwidth = format_rate(report.bandwidth_bytes_per_s)
    if report.datasheet_bandwidth_bytes_per_s:
        share = report.bandwidth_bytes_per_s / report.datasheet_bandwidth_bytes_per_s
        bandwidth += (f" ({share:.0%} of the {report.datasheet_gpu} datasheet's "
                      f"{format_rate(report.datasheet_bandwidth_bytes_per_s)})")
    rows.append(("bandwidth", bandwidth))
    if isinstance(report, MatmulReport | DecodeReport):
        compute = format_flops(report.flops_per_s)
        if isinstance(report, MatmulReport) and report.datasheet_flops_per_s:
            share = report.flops_per_s / report.datasheet_flops_per_s
            compute += (f" ({share:.0%} of the {report.datasheet_gpu} datasheet's dense bf16 "
                        f"{format_flops(report.datasheet_flops_per_s)})")
        rows.append(("compute", compute))
        intensity = f"{report.arithmetic_intensity_flops_per_byte:,.3g} FLOPs per byte moved"
        rows.append(("intensity", intensity))
    if report.device == "cpu":
        rows.append(("note", "a CPU measurement: it says nothing about a GPU"))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)
