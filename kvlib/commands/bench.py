"""``kvlib bench copy|decode|matmul``: measured bandwidth and FLOP/s on this machine's device,
with the datasheet figure and the fraction reached on a GPU :mod:`kvlib.hardware` knows.

Byte counts are the minimum traffic: a copy of N bytes moves 2N (read + write,
STREAM's convention); attention reads the cached K and V once.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Any

from kvlib.commands import UsageError, emit, fail
from kvlib.dtypes import bytes_for, require_dtype
from kvlib.units import format_bytes, format_flops, format_rate, parse_bytes

__all__ = [
    "COPY_COUNTING",
    "BenchReport",
    "CopyReport",
    "DecodeReport",
    "MatmulReport",
    "register",
    "render",
]

_DTYPES = "bf16, fp16, fp32"
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


def register(commands: Any) -> None:
    """Add ``kvlib bench`` and its three workloads to the subcommands."""
    bench = commands.add_parser(
        "bench",
        help="measure copy bandwidth, decode attention and matmul FLOP/s on this device",
        description="Time a workload with CUDA events on a GPU (perf_counter_ns on a CPU) and "
        "report the median, quantiles and achieved rates, labelled with the device.",
    )
    kinds = bench.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    copy = kinds.add_parser("copy", help="device-to-device copy bandwidth (2N bytes moved)")
    copy.add_argument("--bytes", default="256 MiB", help="bytes to copy, e.g. '1 GiB' (256 MiB)")
    decode = kinds.add_parser("decode", help="attention of one new token over a KV cache")
    for flag, default, text in (
        ("--batch", "8", "sequences in the batch"),
        ("--context", "4096", "cached tokens per sequence"),
        ("--heads", "32", "query heads"),
        ("--kv-heads", "8", "key-value heads"),
        ("--head-dim", "128", "dimensions per head"),
    ):
        decode.add_argument(flag, default=default, help=f"{text} ({default})")
    decode.add_argument("--impl", default="sdpa", help="sdpa (default) or matmul")
    matmul = kinds.add_parser("matmul", help="achieved FLOP/s of one matrix product")
    for flag in ("--m", "--n", "--k"):
        matmul.add_argument(flag, default=None, help="size (8192 on a GPU, 1024 on a CPU)")
    for sub in (decode, matmul):
        sub.add_argument("--dtype", default=None, help=f"{_DTYPES} (bf16 on a GPU, fp32 on CPU)")
    for sub in (copy, decode, matmul):
        sub.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
        sub.add_argument("--cache", default="cold", help="cold (flush L2/LLC, default) or warm")
        sub.add_argument("--rep-ms", default="100", help="time spent on timed repetitions (100)")
        sub.add_argument("--warmup-ms", default="25", help="time spent warming up (25)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(handler=run)


def _int(flag: str, text: str, minimum: int = 1) -> int:
    try:
        value = int(str(text).replace("_", "").replace(",", ""))
    except ValueError:
        raise UsageError(f"{flag} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{flag} must be at least {minimum}, got {value}")
    return value


def _seconds(flag: str, text: str) -> float:
    try:
        value = float(text) / 1e3
    except ValueError:
        raise UsageError(f"{flag} must be a number of milliseconds, got {text!r}") from None
    if not value > 0 or value > 600:
        raise UsageError(f"{flag} must be between 0 and 600,000 ms, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    """Time the workload and print its report; one line and exit status 2 on bad input."""
    try:
        report = _measure(args)
    except UsageError as exc:
        return fail("bench", str(exc))
    except (RuntimeError, MemoryError) as exc:  # torch's out-of-memory errors are RuntimeErrors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fail("bench", f"{args.workload} could not run ({first}); try smaller sizes")
    return emit(report, args.json, render)


def _settings(args: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """The workload's checked settings; device-dependent defaults filled for ``on_gpu``."""
    if args.workload == "copy":
        try:
            size = _int("--bytes", str(parse_bytes(args.bytes)))
        except ValueError as exc:
            raise UsageError(f"--bytes: {exc}") from None
        return {"bytes_copied": size, "bytes_counted": COPY_COUNTING}
    if args.workload == "matmul":
        default = "8192" if on_gpu else "1024"
        sizes = {name: _int(f"--{name}", getattr(args, name) or default) for name in "mnk"}
        return {**sizes, "dtype": _dtype(args.dtype, on_gpu)}
    from kvlib.timing.workloads import DECODE_IMPLS

    if args.impl not in DECODE_IMPLS:
        raise UsageError(f"--impl must be one of {', '.join(DECODE_IMPLS)}, got {args.impl!r}")
    settings = {
        "batch": _int("--batch", args.batch),
        "context_tokens": _int("--context", args.context),
        "heads": _int("--heads", args.heads),
        "kv_heads": _int("--kv-heads", args.kv_heads),
        "head_dim": _int("--head-dim", args.head_dim),
        "dtype": _dtype(args.dtype, on_gpu),
        "impl": args.impl,
    }
    if settings["heads"] % settings["kv_heads"]:
        raise UsageError(f"--heads ({settings['heads']}) must be a multiple of --kv-heads "
                         f"({settings['kv_heads']})")
    return settings


def _measure(args: argparse.Namespace) -> BenchReport:
    # Every flag is checked before torch is imported (seconds): bad input fails at once.
    if args.cache not in ("cold", "warm"):
        raise UsageError(f"--cache must be 'cold' or 'warm', got {args.cache!r}")
    rep_s, warmup_s = _seconds("--rep-ms", args.rep_ms), _seconds("--warmup-ms", args.warmup_ms)
    _settings(args, on_gpu=False)

    from kvlib.timing import bench, default_device
    from kvlib.timing import workloads as w
    from kvlib.timing.devices import resolve_device

    try:
        device = str(resolve_device(default_device() if args.device == "auto" else args.device))
    except ValueError as exc:  # not a torch device, or a GPU that is not there
        raise UsageError(str(exc)) from None
    settings = _settings(args, on_gpu=device.startswith("cuda"))
    if args.workload == "copy":
        workload = w.copy(settings["bytes_copied"], device)
    elif args.workload == "matmul":
        workload = w.matmul(**settings, device=device)
    else:
        workload = w.decode_attention(**settings, device=device)
    result = bench(workload.fn, device=device, cache=args.cache, warmup_s=warmup_s, rep_s=rep_s)
    return _report(args.workload, settings, workload, result)


def _dtype(text: str | None, on_gpu: bool) -> str:
    if text is None:
        return "bf16" if on_gpu else "fp32"
    name = ""
    with contextlib.suppress(ValueError):
        name = require_dtype(text)
    if name not in ("bf16", "fp16", "fp32"):
        raise UsageError(f"--dtype {text!r} cannot be timed here: use one of {_DTYPES}")
    return name


def _report(kind: str, settings: dict[str, Any], workload: Any, result: Any) -> BenchReport:
    """The report of ``kind`` from the timing ``result`` of ``workload`` run with ``settings``."""
    from kvlib.hardware import gpu_from_torch_name
    from kvlib.timing import timing_fields

    spec = None
    if result.device.startswith("cuda"):
        with contextlib.suppress(KeyError):
            spec = gpu_from_torch_name(result.device_name)
    common: dict[str, Any] = {
        "workload": workload.name,
        **timing_fields(workload, result),
        "datasheet_gpu": None if spec is None else spec.name,
        "datasheet_bandwidth_bytes_per_s": None if spec is None else spec.hbm_bandwidth_bytes_per_s,
    }
    if kind == "copy":
        return CopyReport(**common, **settings)
    rates: dict[str, Any] = {
        "flops": workload.flops,
        "flops_per_s": result.flops_per_s(workload.flops),
        "arithmetic_intensity_flops_per_byte": workload.intensity_flops_per_byte,
    }
    if kind == "matmul":
        bf16 = spec is not None and settings["dtype"] == "bf16"
        peak = spec.bf16_dense_flops_per_s if bf16 and spec is not None else None
        return MatmulReport(**common, **rates, **settings, datasheet_flops_per_s=peak)
    # K and V: 2 x B x H_kv x T x d elements.
    elements = 2 * settings["batch"] * settings["kv_heads"] * settings["context_tokens"]
    kv_bytes = bytes_for(elements * settings["head_dim"], settings["dtype"])
    return DecodeReport(**common, **rates, **settings, kv_cache_bytes=kv_bytes)


def _duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:,.3g} {unit}"
    return f"{seconds / 1e-9:,.3g} ns"


def render(report: BenchReport) -> str:
    """The human-readable table of a bench report."""
    flushed = (
        f", {format_bytes(report.flush_bytes)} written before each" if report.flush_bytes else ""
    )
    rows = [
        ("device", f"{report.device}: {report.device_name}"),
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
