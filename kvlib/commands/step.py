"""``kvlib step MODEL``: one engine step's time, each operation's term, and what the GPU keeps."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kvlib.commands import UsageError, emit, fail, flags
from kvlib.config import ConfigError
from kvlib.dtypes import DTYPE_BITS
from kvlib.hardware import get_gpu, gpu_names
from kvlib.step import ASSUMED_MFU, VLLM_MAX_NUM_BATCHED_TOKENS_API, mixed_step

__all__ = ["StepReport", "register", "render", "step_report"]

AUTO = "auto"


@dataclass(frozen=True)
class StepReport:
    """Everything ``kvlib step`` prints; ``--json`` prints these fields (one GPU's share)."""

    model: str
    gpu: str
    tp: int
    mfu: float
    kv_dtype: str
    weight_dtype: str  # "auto": as shipped
    matmul_dtype: str
    decode_batch: int
    context_tokens: int
    prefill_tokens: int
    prefill_cached_tokens: int
    weight_bytes: int
    weight_flops: int
    weights_s: float
    weights_bound: str
    decode_kv_bytes: int
    decode_attention_flops: int
    decode_attention_s: float
    prefill_kv_bytes: int
    prefill_attention_flops: int
    prefill_attention_s: float
    step_s: float
    decode_tokens_per_s: float
    flops_per_s: float
    hbm_bytes_per_s: float
    flops_ceiling_per_s: float  # MFU x the weight GEMMs' dense peak
    hbm_bandwidth_bytes_per_s: float
    notes: list[str]


def register(commands: Any) -> None:
    """Add ``kvlib step`` to the subcommands."""
    step = commands.add_parser(
        "step",
        help="one engine step's time: weight GEMMs + decode attention + prefill attention",
        description="The time of one step holding --decode-batch sequences at --context "
        "cached tokens each and one prefill chunk of --prefill-tokens, on one GPU of a "
        "tensor-parallel group. Each operation takes max(bytes / bandwidth, FLOPs / "
        "(MFU x peak)) and the operations' times add. A lower bound: no kernel launch, "
        "scheduler gap or all-reduce is counted.",
    )
    step.add_argument("model", help="path to a config.json (or its folder), a bundled name, "
                      "or a Hugging Face model id")
    step.add_argument("--gpu", default="H100-SXM", help=f"one of {', '.join(gpu_names())} "
                      "(H100-SXM)")
    step.add_argument("--decode-batch", type=int, default=0, help="sequences decoding (0)")
    step.add_argument("--context", type=int, default=0,
                      help="cached tokens of each decoding sequence (0)")
    step.add_argument("--prefill-tokens", type=int, default=0,
                      help="prompt tokens of the step's prefill chunk (0)")
    step.add_argument("--prefill-cached", type=int, default=0,
                      help="tokens of that prompt already cached before the chunk (0)")
    step.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                      help=f"model FLOPs utilization, an assumption ({ASSUMED_MFU})")
    step.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (1)")
    dtypes = ", ".join(DTYPE_BITS)
    step.add_argument("--kv-dtype", default="bf16", help=f"KV element type: {dtypes} (bf16)")
    step.add_argument("--weight-dtype", default="bf16",
                      help=f"weight element type: {dtypes}, or {AUTO} for as shipped (bf16)")
    step.add_argument("--matmul-dtype", default="bf16", choices=("bf16", "fp8"),
                      help="peak the weight GEMMs run at: fp8 for W8A8 weights (bf16)")
    step.add_argument("--json", action="store_true", help="print one JSON object")
    step.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the step report; exit status 2 with one line on bad input."""
    try:
        report = step_report(args)
    except (ConfigError, UsageError) as exc:
        return fail("step", str(exc.args[0]) if exc.args else str(exc))
    return emit(report, args.json, render)


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value in (("--decode-batch", args.decode_batch), ("--context", args.context),
                        ("--prefill-tokens", args.prefill_tokens),
                        ("--prefill-cached", args.prefill_cached)):
        if value < 0:
            raise UsageError(f"{flag} must be at least 0, got {value}")
    if args.tp < 1:
        raise UsageError(f"--tp must be at least 1, got {args.tp}")
    if args.decode_batch == 0 and args.prefill_tokens == 0:
        raise UsageError("the step is empty: give --decode-batch or --prefill-tokens")
    if not 0 < args.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], e.g. {ASSUMED_MFU}, got {args.mfu}")


def _notes(args: argparse.Namespace) -> list[str]:
    notes = [f"MFU {args.mfu:g} is an assumption, not a measurement"]
    tokens = args.decode_batch + args.prefill_tokens
    if tokens > VLLM_MAX_NUM_BATCHED_TOKENS_API:
        notes.append(f"{tokens:,} tokens exceed vLLM's API-server token budget on a 70 GiB+ "
                     f"card ({VLLM_MAX_NUM_BATCHED_TOKENS_API:,}, --max-num-batched-tokens)")
    return notes


def step_report(args: argparse.Namespace) -> StepReport:
    """The report for parsed ``kvlib step`` arguments; UsageError/ConfigError on bad input."""
    _check_counts(args)
    kv_dtype = flags.dtype("--kv-dtype", args.kv_dtype)
    weight_dtype = None if args.weight_dtype == AUTO else flags.dtype("--weight-dtype",
                                                                  args.weight_dtype)
    try:
        gpu = get_gpu(args.gpu)
    except KeyError as err:
        raise UsageError(str(err.args[0])) from None
    cfg = flags.model(args.model)
    flags.tp(cfg, "--tp", args.tp)
    try:
        s = mixed_step(cfg, gpu, args.decode_batch, args.context, args.prefill_tokens,
                       args.prefill_cached, mfu=args.mfu, tp=args.tp, kv_dtype=kv_dtype,
                       weight_dtype=weight_dtype, matmul_dtype=args.matmul_dtype)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return StepReport(
        model=cfg.name, gpu=gpu.name, tp=args.tp, mfu=args.mfu, kv_dtype=kv_dtype,
        weight_dtype=weight_dtype or AUTO, matmul_dtype=args.matmul_dtype,
        decode_batch=args.decode_batch, context_tokens=args.context,
        prefill_tokens=args.prefill_tokens, prefill_cached_tokens=args.prefill_cached,
        weight_bytes=s.weight_bytes, weight_flops=s.weight_flops, weights_s=s.weights_s,
        weights_bound=s.weights_bound, decode_kv_bytes=s.decode_kv_bytes,
        decode_attention_flops=s.decode_attention_flops, decode_attention_s=s.decode_attention_s,
        prefill_kv_bytes=s.prefill_kv_bytes, prefill_attention_flops=s.prefill_attention_flops,
        prefill_attention_s=s.prefill_attention_s, step_s=s.total_s,
        decode_tokens_per_s=s.decode_tokens_per_s, flops_per_s=s.flops_per_s,
        hbm_bytes_per_s=s.hbm_bytes_per_s, flops_ceiling_per_s=s.matmul_flops_ceiling_per_s,
        hbm_bandwidth_bytes_per_s=s.bandwidth_bytes_per_s, notes=_notes(args),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def _term(seconds: float, n_bytes: int, flops: int) -> str:
    return f"{_ms(seconds):>12}  ({n_bytes / 1e9:,.2f} GB, {flops / 1e12:,.2f} TFLOP)"


def render(r: StepReport) -> str:
    """The human-readable table: each term, the total, and the rates it implies."""
    rows = [
        ("model", f"{r.model} on {r.gpu}" + (f" (tp={r.tp}, per GPU)" if r.tp > 1 else "")),
        ("step", f"{r.decode_batch} decodes at {r.context_tokens:,} tokens + "
                 f"{r.prefill_tokens:,} prefill tokens after {r.prefill_cached_tokens:,}"),
        ("weight GEMMs", _term(r.weights_s, r.weight_bytes, r.weight_flops)
         + f" {r.weights_bound}-bound"),
        ("decode attention", _term(r.decode_attention_s, r.decode_kv_bytes,
                                   r.decode_attention_flops)),
        ("prefill attention", _term(r.prefill_attention_s, r.prefill_kv_bytes,
                                    r.prefill_attention_flops)),
        ("step time", f"{_ms(r.step_s):>12}  (the three added)"),
        ("decode tokens/s", f"{r.decode_tokens_per_s:,.0f}"),
        ("FLOP/s", f"{r.flops_per_s / 1e12:,.1f} TFLOP/s of {r.flops_ceiling_per_s / 1e12:,.1f} "
                   f"(MFU {r.mfu:g} x peak)"),
        ("HBM bytes/s", f"{r.hbm_bytes_per_s / 1e12:,.2f} TB/s of "
                        f"{r.hbm_bandwidth_bytes_per_s / 1e12:,.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines + [f"note: {n}" for n in r.notes])
