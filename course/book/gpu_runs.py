"""The course's GPU runs as JSON: what ``scripts/gpu_check.py`` writes and the book reads back.

One file is one run on one GPU: a preflight, one entry per section of the
check (ran, failed with the exception and settings, or skipped with the
reason), and every measurement. The check rewrites the file after each
measurement, so a run cut short is still a file: :func:`read_run` takes it as
it comes. It accepts only a run whose device is a CUDA GPU and whose every
measurement was timed with CUDA events, and refuses a rehearsal (the check run
on a CPU at tiny sizes), so a CPU timing can never be shown as a GPU figure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvlib.timing import timing_fields
from kvlib.units import format_flops, format_rate

__all__ = [
    "SCHEMA",
    "SECTION_STATUSES",
    "GpuRun",
    "Measurement",
    "Section",
    "kv_read_bars",
    "load_runs",
    "measurement_record",
    "measurement_rows",
    "read_rehearsal",
    "read_run",
    "roofline_points",
    "section_rows",
    "summarise",
    "summary_rows",
]

SCHEMA = "kvlib-gpu-check/2"
# A section is pending until it starts; "running" in a file means the run stopped inside it.
SECTION_STATUSES = ("pending", "running", "ok", "failed", "skipped", "interrupted")
_NUMBERS = ("median_s", "p20_s", "p80_s", "bandwidth_bytes_per_s", "flops_per_s")
# How a Measurement field's JSON value is read, by the field's annotation.
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "dict[str, Any]": dict,
}
# Measurement names: the contiguous KV read and its paged variant.
KV_READ, PAGED_KV_READ = "kv-read/", "kv-read-paged/"


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
class Section:
    """One section of a run: whether it ran, and if not, why."""

    name: str
    status: str
    detail: str
    elapsed_s: float | None
    clocks: dict[str, Any]


@dataclass(frozen=True)
class GpuRun:
    """A run of ``scripts/gpu_check.py`` on one GPU, read from its JSON file."""

    path: str
    device_name: str
    date: str
    driver: str | None
    datasheet_gpu: str | None
    status: str
    sections: tuple[Section, ...]
    measurements: tuple[Measurement, ...]
    failed_measurements: tuple[dict[str, Any], ...]
    skipped: tuple[dict[str, Any], ...]
    preflight: dict[str, Any]
    summary: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)

    def named(self, prefix: str) -> list[Measurement]:
        """The measurements whose name starts with ``prefix`` (``"matmul"``, ``"copy"``)."""
        return [m for m in self.measurements if m.name.startswith(prefix)]

    @property
    def complete(self) -> bool:
        """True when the check reached its end (some sections may still have failed)."""
        return self.status == "complete"

    def with_status(self, status: str) -> list[Section]:
        """The sections whose status is ``status`` ("ok", "failed", "skipped", ...)."""
        return [s for s in self.sections if s.status == status]




def measurement_record(
    name: str, workload: Any, result: Any, settings: dict[str, Any]
) -> dict[str, Any]:
    """A JSON-ready record of ``result`` (a :class:`~kvlib.timing.TimingResult`) of ``workload``."""
    return {
        "name": name,
        "settings": settings,
        **timing_fields(workload, result),
        "warmup_reps": result.warmup_reps,
        "flush": result.flush if result.cache == "cold" else None,
        "flops": workload.flops,
        "flops_per_s": result.flops_per_s(workload.flops),
        "times_s": list(result.times_s),  # every repetition, not only the statistics
    }


def _field(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise ValueError(f"{where}: field {key!r} is missing")
    return doc[key]


def _measurement(raw: dict[str, Any], where: str) -> Measurement:
    clock = _field(raw, "clock", where)
    if clock != "cuda-events" or not str(_field(raw, "device", where)).startswith("cuda"):
        raise ValueError(f"{where}: timed by {clock!r} on {raw.get('device')!r}, not by CUDA "
                         "events on a GPU; a CPU time is never shown as a GPU figure")
    for key in _NUMBERS:
        value = _field(raw, key, where)
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    if not _field(raw, "median_s", where) > 0:
        raise ValueError(f"{where}: median_s must be positive")
    read = {f.name: _READERS[str(f.type)](_field(raw, f.name, where)) for f in fields(Measurement)}
    return Measurement(**read)


def _section(name: str, raw: Any, where: str) -> Section:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: section {name!r} must be an object, got {raw!r}")
    status = raw.get("status")
    if status not in SECTION_STATUSES:
        raise ValueError(f"{where}: section {name!r} field 'status' is {status!r}, not one "
                         f"of {', '.join(SECTION_STATUSES)}")
    error = raw.get("error") or {}
    if status == "failed":
        detail = f"{error.get('type', 'error')}: {error.get('message', '')}"
    else:
        detail = str(raw.get("reason") or "")
    elapsed = raw.get("elapsed_s")
    return Section(
        name=name,
        status=status,
        detail=detail,
        elapsed_s=float(elapsed) if isinstance(elapsed, int | float) else None,
        clocks=dict(raw.get("clocks") or {}),
    )


def read_run(path: Path) -> GpuRun:
    """The run in ``path``, complete or cut short; ValueError naming the field if it is not
    a GPU run of this schema (a rehearsal on a CPU is refused)."""
    doc = json.loads(Path(path).read_text())
    where = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a {SCHEMA} file (field 'schema')")
    if doc.get("rehearsal") is not False:
        raise ValueError(f"{where}: field 'rehearsal' is {doc.get('rehearsal')!r}: a rehearsal "
                         "ran the check on a CPU and is never shown as a GPU run")
    device = _field(doc, "device", where)
    if not isinstance(device, dict) or device.get("type") != "cuda":
        kind = device.get("type") if isinstance(device, dict) else device
        raise ValueError(f"{where}: device type is {kind!r}, not 'cuda'")
    measurements = tuple(
        _measurement(raw, f"{where}, measurement {i}")
        for i, raw in enumerate(_field(doc, "measurements", where))
    )
    sections = _field(doc, "sections", where)
    if not isinstance(sections, dict):
        raise ValueError(f"{where}: field 'sections' must map section names to their status")
    datasheet = doc.get("datasheet") or {}
    return GpuRun(
        path=where,
        device_name=str(_field(device, "name", where)),
        date=str(_field(doc, "date", where)),
        driver=device.get("driver"),
        datasheet_gpu=datasheet.get("gpu"),
        status=str(_field(doc, "status", where)),
        sections=tuple(_section(name, raw, where) for name, raw in sections.items()),
        measurements=measurements,
        failed_measurements=tuple(doc.get("failed_measurements", ())),
        skipped=tuple(doc.get("skipped", ())),
        preflight=dict(doc.get("preflight") or {}),
        summary=dict(doc.get("summary") or {}),
        results=dict(doc.get("results") or {}),
    )


def load_runs(folder: Path, pattern: str = "gpu_*.json") -> list[GpuRun]:
    """Every GPU run in ``folder`` matching ``pattern``, oldest date first."""
    return sorted((read_run(p) for p in sorted(Path(folder).glob(pattern))), key=lambda r: r.date)


def section_rows(run: GpuRun) -> list[tuple[str, str, str]]:
    """(section, status, detail) for each section: what ran, what failed and why."""
    return [(s.name, s.status, s.detail) for s in run.sections]


def _status_text(run: GpuRun) -> str:
    counts = {k: len(run.with_status(k)) for k in SECTION_STATUSES}
    parts = [f"{counts[k]} {k}" for k in SECTION_STATUSES if counts[k]]
    ending = "complete" if run.complete else f"stopped early ({run.status})"
    return f"{ending}; sections: {', '.join(parts) or 'none'}"


def summary_rows(run: GpuRun) -> list[tuple[str, str]]:
    """The headline figures of a run, as (label, text) rows with their units.

    A figure whose measurement is missing (a partial run) has no row.
    """
    s = run.summary
    rows = [("device", run.device_name), ("date", run.date), ("driver", run.driver or "unknown"),
            ("run", _status_text(run))]
    rates = (
        ("copy_bandwidth_bytes_per_s", "copy bandwidth (2N / median)", format_rate),
        ("read_bandwidth_bytes_per_s", "read bandwidth", format_rate),
        ("best_kv_read_bandwidth_bytes_per_s", "best KV read (decode attention)", format_rate),
        ("best_paged_kv_read_bandwidth_bytes_per_s", "best paged KV read", format_rate),
        ("matmul_peak_flops_per_s", "bf16 matmul", format_flops),
    )
    for key, label, fmt in rates:
        if isinstance(s.get(key), int | float):
            rows.append((label, fmt(s[key])))
    if isinstance(s.get("measured_ridge_flops_per_byte"), int | float):
        rows.append(("measured ridge point", f"{s['measured_ridge_flops_per_byte']:,.0f} FLOPs/B"))
    goal = s.get("goal_kv_read_over_stream", 0.9)
    for ref in ("read", "copy"):
        ratio = s.get(f"kv_read_over_{ref}")
        if isinstance(ratio, int | float):
            verdict = "met" if ratio >= goal else "not met"
            rows.append((f"KV read / {ref}", f"{ratio:.1%} (goal {goal:.0%}: {verdict})"))
    if isinstance(s.get("paged_over_contiguous"), int | float):
        rows.append(("paged / contiguous KV read", f"{s['paged_over_contiguous']:.1%}"))
    for name, entry in (s.get("paged_over_contiguous_by_kernel") or {}).items():
        rows.append((f"{name} / {entry['over']}", f"{entry['ratio']:.1%}"))
    if s.get("read_reference"):
        rows.append(("read reference (the faster read)", str(s["read_reference"])))
    rows.extend(_result_rows(run.results))
    return rows


def _clock(reading: Any) -> str:
    if not isinstance(reading, dict) or reading.get("sm_mhz") is None:
        return "not read"
    return f"SM {reading['sm_mhz']:.0f} MHz, memory {reading.get('mem_mhz') or '?'} MHz"


def _result_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """The clocks around the warm-up and the sustained peak, and do_bench's agreement."""
    rows = []
    warm = results.get("warmup") or {}
    if warm:
        rows.append(("clocks before / after warm-up",
                     f"{_clock(warm.get('clocks_before'))} / {_clock(warm.get('clocks_after'))}"))
    peak = results.get("matmul_peak") or {}
    if peak.get("first_tenth_median_s") and peak.get("last_tenth_median_s"):
        drift = peak["last_tenth_median_s"] / peak["first_tenth_median_s"]
        rows.append(("sustained matmul: last tenth / first tenth",
                     f"{drift:.3f} over {peak.get('sustained_s', 0):.1f} s; clocks "
                     f"{_clock(peak.get('clocks_before'))} -> {_clock(peak.get('clocks_after'))}"))
    agreement = results.get("agreement") or {}
    for workload in ("copy", "kv_read"):
        entry = agreement.get(workload)
        if isinstance(entry, dict) and "over_do_bench_read_flush" in entry:
            rows.append((f"kvlib / do_bench, {workload.replace('_', ' ')}",
                         f"{entry['over_do_bench_read_flush']:.3f} (read flush), "
                         f"{entry['over_do_bench_write_flush']:.3f} (write flush, as do_bench)"))
    return rows


def roofline_points(run: GpuRun, prefix: str = "matmul/") -> list[tuple[str, float, float]]:
    """(name, FLOPs per byte, achieved FLOP/s) of the run's measurements named ``prefix...``."""
    return [
        (m.name, m.intensity_flops_per_byte, m.flops_per_s)
        for m in run.named(prefix)
        if m.flops > 0 and m.bytes_moved > 0
    ]


def kv_read_bars(run: GpuRun) -> list[tuple[str, float]]:
    """(name, bandwidth) of every KV read, contiguous then paged, in the run's order."""
    return [(m.name, m.bandwidth_bytes_per_s)
            for prefix in (KV_READ, PAGED_KV_READ) for m in run.named(prefix)]


def _best(measurements: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    found = [m for m in measurements if m["name"].startswith(prefix)]
    return max(found, key=lambda m: m["bandwidth_bytes_per_s"]) if found else None


def summarise(measurements: list[dict[str, Any]], copy_name: str, goal: float) -> dict[str, Any]:
    """A run's headline figures from its measurement records (as :func:`measurement_record`).

    The KV-read benchmark (best ``kv-read/*`` bandwidth) over the pure read
    stream (like with like: decode attention reads the cache and writes almost
    nothing), the faster of ``torch.sum`` (``read``) and the Triton streaming
    read (``read-triton/*``), and over the copy ``copy_name``, each against
    ``goal``; the best paged KV read (``kv-read-paged/*``) over the best
    contiguous one, and each paged read over the contiguous read by the same
    kernel (``kv-read-paged/triton-16`` over ``kv-read/triton``: paging's own
    cost); the memory ceiling, the faster of the copy and the read
    (memory delivered at least that much); the matmul peak; and their ratio,
    the measured ridge point. A figure whose measurement is missing is None or
    absent, so a partial run summarises what it has.
    """
    by_name = {m["name"]: m for m in measurements}
    copy, peak = by_name.get(copy_name), by_name.get("matmul-peak")
    reads = [m for m in (by_name.get("read"), _best(measurements, "read-triton/")) if m]
    read = max(reads, key=lambda m: m["bandwidth_bytes_per_s"]) if reads else None
    best, paged = _best(measurements, KV_READ), _best(measurements, PAGED_KV_READ)
    summary: dict[str, Any] = {
        "copy_bandwidth_bytes_per_s": copy and copy["bandwidth_bytes_per_s"],
        "read_bandwidth_bytes_per_s": read and read["bandwidth_bytes_per_s"],
        "read_reference": read and read["name"],
        "best_kv_read": best and best["name"],
        "best_kv_read_bandwidth_bytes_per_s": best and best["bandwidth_bytes_per_s"],
        "best_paged_kv_read": paged and paged["name"],
        "best_paged_kv_read_bandwidth_bytes_per_s": paged and paged["bandwidth_bytes_per_s"],
        "matmul_peak_flops_per_s": peak and peak["flops_per_s"],
        "goal_kv_read_over_stream": goal,
    }
    for ref_name, ref in (("read", read), ("copy", copy)):
        if ref and best:
            ratio = best["bandwidth_bytes_per_s"] / ref["bandwidth_bytes_per_s"]
            summary[f"kv_read_over_{ref_name}"] = ratio
            summary[f"goal_met_vs_{ref_name}"] = ratio >= goal
    if paged and best:
        summary["paged_over_contiguous"] = (
            paged["bandwidth_bytes_per_s"] / best["bandwidth_bytes_per_s"]
        )
    same = {}
    for m in measurements:
        if m["name"].startswith(PAGED_KV_READ):
            impl = m["name"][len(PAGED_KV_READ):].rsplit("-", 1)[0]
            contiguous = by_name.get(f"{KV_READ}{impl}") or by_name.get(f"{KV_READ}sdpa")
            if contiguous:
                same[m["name"]] = {
                    "over": contiguous["name"],
                    "ratio": m["bandwidth_bytes_per_s"] / contiguous["bandwidth_bytes_per_s"],
                }
    if same:
        summary["paged_over_contiguous_by_kernel"] = same
    streams = [m["bandwidth_bytes_per_s"] for m in (copy, read) if m]
    if streams and peak:
        summary["memory_ceiling_bytes_per_s"] = max(streams)
        summary["measured_ridge_flops_per_byte"] = peak["flops_per_s"] / max(streams)
    return summary


def read_rehearsal(path: Path) -> dict[str, Any]:
    """A rehearsal's document (the check run on a CPU at tiny sizes), to show its fields;
    ValueError naming the field if the file is not a rehearsal of this schema."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} file (field 'schema')")
    if doc.get("rehearsal") is not True:
        raise ValueError(f"{path}: field 'rehearsal' is {doc.get('rehearsal')!r}: not a "
                         "rehearsal (a GPU run is read with read_run)")
    return doc


def _check_text(check: Any) -> str:
    if not isinstance(check, dict):
        return "not recorded"
    if not check.get("checked"):
        return f"none ({check.get('reason', 'no reference')})"
    return f"matches (largest error {check['max_abs_error']:.2g})"


def measurement_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(name, bytes moved, repetitions kept, output check, outcome) for every measurement a
    run's document names: timed (its flush), failed (the exception) or skipped (why)."""
    rows = []
    for m in doc.get("measurements", []):
        kept = len(m.get("times_s") or [])
        flush = f"cold, flush {m['flush']}s" if m.get("flush") else str(m.get("cache", ""))
        rows.append((m["name"], f"{m['bytes_moved']:,}", f"{kept} of {m['reps']}",
                     _check_text(m.get("output_check")), f"timed ({flush})"))
    for m in doc.get("failed_measurements", []):
        rows.append((m["name"], "", "", "", f"failed: {m.get('type')}: {m.get('message')}"))
    for m in doc.get("skipped", []):
        rows.append((m["name"], "", "", "", f"skipped: {m.get('reason')}"))
    return rows
