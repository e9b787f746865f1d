"""Measurements as JSON: what ``scripts/gpu_check.py`` writes and the book reads back.

One file is one run on one GPU: the device (name, driver, clocks), the date,
and every measurement with its settings, median, quantiles, bytes and FLOPs.
:func:`read_run` accepts only a run whose device is a CUDA GPU and whose
every measurement was timed with CUDA events, so a CPU timing can never be
shown as a GPU figure. Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlib.units import format_flops, format_rate

__all__ = [
    "SCHEMA",
    "GpuRun",
    "Measurement",
    "load_runs",
    "measurement_record",
    "read_run",
    "roofline_points",
    "summarise",
    "summary_rows",
    "timing_fields",
]

SCHEMA = "kvlib-gpu-check/1"
_NUMBERS = ("median_s", "p20_s", "p80_s", "bandwidth_bytes_per_s", "flops_per_s")


@dataclass(frozen=True)
class Measurement:
    """One timed workload of a run."""

    name: str
    description: str
    settings: dict[str, Any]
    clock: str
    cache: str
    reps: int
    median_s: float
    p20_s: float
    p80_s: float
    bytes_moved: int
    flops: int
    bandwidth_bytes_per_s: float
    flops_per_s: float

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved else math.inf


@dataclass(frozen=True)
class GpuRun:
    """A run of ``scripts/gpu_check.py`` on one GPU, read from its JSON file."""

    path: str
    device_name: str
    date: str
    driver: str | None
    datasheet_gpu: str | None
    measurements: tuple[Measurement, ...]
    summary: dict[str, Any]

    def named(self, prefix: str) -> list[Measurement]:
        """The measurements whose name starts with ``prefix`` (``"matmul"``, ``"copy"``)."""
        return [m for m in self.measurements if m.name.startswith(prefix)]


def timing_fields(workload: Any, result: Any) -> dict[str, Any]:
    """What every report of a timed ``workload`` carries: the device and clock, the cache
    state, the repetitions, the time quantiles and the bandwidth (``kvlib bench`` and the
    GPU check's records share them)."""
    return {
        "description": workload.description,
        "device": result.device,
        "device_name": result.device_name,
        "clock": result.clock,
        "cache": result.cache,
        "flush_bytes": result.flush_bytes,
        "reps": result.reps,
        "median_s": result.median_s,
        "p20_s": result.quantile_s(0.2),
        "p80_s": result.quantile_s(0.8),
        "min_s": result.min_s,
        "resolution_limited": result.resolution_limited,
        "bytes_moved": workload.bytes_moved,
        "bandwidth_bytes_per_s": result.bandwidth_bytes_per_s(workload.bytes_moved),
    }


def measurement_record(
    name: str, workload: Any, result: Any, settings: dict[str, Any]
) -> dict[str, Any]:
    """A JSON-ready record of ``result`` (a :class:`~kvlib.timing.TimingResult`) of ``workload``."""
    return {
        "name": name,
        "settings": settings,
        **timing_fields(workload, result),
        "warmup_reps": result.warmup_reps,
        "flops": workload.flops,
        "flops_per_s": result.flops_per_s(workload.flops),
    }


def _field(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise ValueError(f"{where}: field {key!r} is missing")
    return doc[key]


def _measurement(raw: dict[str, Any], where: str) -> Measurement:
    clock = _field(raw, "clock", where)
    if clock != "cuda-events" or not str(_field(raw, "device", where)).startswith("cuda"):
        raise ValueError(f"{where}: timed by {clock!r} on {raw.get('device')!r}, not by CUDA "
                         "events on a GPU; a CPU time is never shown as a GPU figure")  # fmt: skip
    for key in _NUMBERS:
        value = _field(raw, key, where)
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    if not _field(raw, "median_s", where) > 0:
        raise ValueError(f"{where}: median_s must be positive")
    return Measurement(
        name=str(_field(raw, "name", where)),
        description=str(_field(raw, "description", where)),
        settings=dict(_field(raw, "settings", where)),
        clock=clock,
        cache=str(_field(raw, "cache", where)),
        reps=int(_field(raw, "reps", where)),
        median_s=float(raw["median_s"]),
        p20_s=float(raw["p20_s"]),
        p80_s=float(raw["p80_s"]),
        bytes_moved=int(_field(raw, "bytes_moved", where)),
        flops=int(_field(raw, "flops", where)),
        bandwidth_bytes_per_s=float(raw["bandwidth_bytes_per_s"]),
        flops_per_s=float(raw["flops_per_s"]),
    )


def read_run(path: Path) -> GpuRun:
    """The run in ``path``; ValueError naming the field if it is not a GPU run of this schema."""
    doc = json.loads(Path(path).read_text())
    where = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a {SCHEMA} file (field 'schema')")
    device = _field(doc, "device", where)
    if device.get("type") != "cuda":
        raise ValueError(f"{where}: device type is {device.get('type')!r}, not 'cuda'")
    measurements = tuple(
        _measurement(raw, f"{where}, measurement {i}")
        for i, raw in enumerate(_field(doc, "measurements", where))
    )
    if not measurements:
        raise ValueError(f"{where}: no measurements")
    datasheet = doc.get("datasheet") or {}
    return GpuRun(
        path=where,
        device_name=str(_field(device, "name", where)),
        date=str(_field(doc, "date", where)),
        driver=device.get("driver"),
        datasheet_gpu=datasheet.get("gpu"),
        measurements=measurements,
        summary=dict(doc.get("summary", {})),
    )


def load_runs(folder: Path, pattern: str = "gpu_*.json") -> list[GpuRun]:
    """Every GPU run in ``folder`` matching ``pattern``, oldest date first."""
    return sorted((read_run(p) for p in sorted(Path(folder).glob(pattern))), key=lambda r: r.date)


def summary_rows(run: GpuRun) -> list[tuple[str, str]]:
    """The headline figures of a run, as (label, text) rows with their units."""
    s = run.summary
    rows = [("device", run.device_name), ("date", run.date), ("driver", run.driver or "unknown")]
    rates = (
        ("copy_bandwidth_bytes_per_s", "copy bandwidth (2N / median)", format_rate),
        ("read_bandwidth_bytes_per_s", "read bandwidth", format_rate),
        ("best_kv_read_bandwidth_bytes_per_s", "best KV read (decode attention)", format_rate),
        ("matmul_peak_flops_per_s", "bf16 matmul", format_flops),
    )
    for key, label, fmt in rates:
        if isinstance(s.get(key), int | float):
            rows.append((label, fmt(s[key])))
    if isinstance(s.get("measured_ridge_flops_per_byte"), int | float):
        rows.append(("measured ridge point", f"{s['measured_ridge_flops_per_byte']:,.0f} FLOPs/B"))
    if isinstance(s.get("kv_read_over_copy"), int | float):
        verdict = "met" if s.get("goal_met") else "not met"
        goal = s.get("goal_kv_read_over_copy", 0.9)
        rows.append(
            ("KV read / copy", f"{s['kv_read_over_copy']:.1%} (goal {goal:.0%}: {verdict})")
        )
    return rows


def roofline_points(run: GpuRun, prefix: str = "matmul/") -> list[tuple[str, float, float]]:
    """(name, FLOPs per byte, achieved FLOP/s) of the run's measurements named ``prefix...``."""
    return [
        (m.name, m.intensity_flops_per_byte, m.flops_per_s)
        for m in run.named(prefix)
        if m.flops > 0 and m.bytes_moved > 0
    ]


def summarise(measurements: list[dict[str, Any]], copy_name: str, goal: float) -> dict[str, Any]:
    """A run's headline figures from its measurement records (as :func:`measurement_record`).

    The KV-read benchmark (best ``kv-read/*`` bandwidth) over the copy ``copy_name``,
    against ``goal``; the memory ceiling, the faster of the copy and the pure read
    (memory delivered at least that much); the matmul peak; and their ratio, the
    measured ridge point. A figure whose measurement is missing is None.
    """
    by_name = {m["name"]: m for m in measurements}
    copy, read, peak = by_name.get(copy_name), by_name.get("read"), by_name.get("matmul-peak")
    kv = [m for m in measurements if m["name"].startswith("kv-read/")]
    best = max(kv, key=lambda m: m["bandwidth_bytes_per_s"]) if kv else None
    summary: dict[str, Any] = {
        "copy_bandwidth_bytes_per_s": copy and copy["bandwidth_bytes_per_s"],
        "read_bandwidth_bytes_per_s": read and read["bandwidth_bytes_per_s"],
        "best_kv_read": best and best["name"],
        "best_kv_read_bandwidth_bytes_per_s": best and best["bandwidth_bytes_per_s"],
        "matmul_peak_flops_per_s": peak and peak["flops_per_s"],
        "goal_kv_read_over_copy": goal,
    }
    if copy and best:
        ratio = best["bandwidth_bytes_per_s"] / copy["bandwidth_bytes_per_s"]
        summary.update(kv_read_over_copy=ratio, goal_met=ratio >= goal)
    streams = [m["bandwidth_bytes_per_s"] for m in (copy, read) if m]
    if streams and peak:
        summary["memory_ceiling_bytes_per_s"] = max(streams)
        summary["measured_ridge_flops_per_byte"] = peak["flops_per_s"] / max(streams)
    return summary
