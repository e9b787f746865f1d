"""``kvlib reload MODEL``: reload a cached prefix over a link, or recompute it, and the
prefix length where the two cross."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kvlib.bounds import kv_bytes_per_gpu
from kvlib.commands import UsageError, emit, fail, flags
from kvlib.config import ConfigError
from kvlib.hardware import get_gpu, gpu_names
from kvlib.step import ASSUMED_MFU
from kvlib.tiers.links import link_names
from kvlib.tiers.reload import break_even_tokens, recompute_s, reload_s

__all__ = ["ReloadReport", "register", "reload_report", "render"]


@dataclass(frozen=True)
class ReloadReport:
    """Everything ``kvlib reload`` prints; ``--json`` prints these fields (one GPU's share)."""

    model: str
    gpu: str
    link: str
    tp: int
    mfu: float
    kv_dtype: str
    prefix_tokens: int
    bytes_per_s: float  # the link's datasheet rate, one direction
    link_source: str
    measured_bytes_per_s: float | None
    reload_bytes: int  # one GPU's share of the prefix's cache
    reload_s: float
    recompute_s: float
    reload_wins: bool
    break_even_tokens: int | None  # null when reloading wins at every prefix length
    recompute_wins_from: int | None
    recompute_wins_to_max: bool
    max_tokens: int


def register(commands: Any) -> None:
    """Add ``kvlib reload`` to the subcommands."""
    cmd = commands.add_parser(
        "reload",
        help="reload a cached prefix over a link, or recompute it: times and break-even",
        description="Time to reload --prefix-tokens tokens of cache over --link (each GPU's "
        "share over its own link, datasheet rate) against the step model's time to prefill "
        "them again at --mfu, attention's quadratic term included, and the prefix length "
        "past which reloading wins.",
    )
    cmd.add_argument("model", help="path to a config.json (or its folder), a bundled name, "
                     "or a Hugging Face model id")
    cmd.add_argument("--prefix-tokens", type=int, required=True, help="tokens of the prefix")
    cmd.add_argument("--link", required=True, help=f"one of {', '.join(link_names())}")
    cmd.add_argument("--gpu", default="H100-SXM", help=f"one of {', '.join(gpu_names())} "
                     "(H100-SXM)")
    cmd.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                     help=f"model FLOPs utilization of the recompute, an assumption "
                     f"({ASSUMED_MFU})")
    cmd.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (1)")
    cmd.add_argument("--kv-dtype", default="bf16", help="KV element type (bf16)")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the reload report; exit status 2 with one line on bad input."""
    try:
        report = reload_report(args)
    except (ConfigError, UsageError) as exc:
        return fail("reload", str(exc.args[0]) if exc.args else str(exc))
    return emit(report, args.json, render)


def reload_report(args: argparse.Namespace) -> ReloadReport:
    """The report for parsed ``kvlib reload`` arguments; UsageError/ConfigError on bad input."""
    if args.prefix_tokens < 1:
        raise UsageError(f"--prefix-tokens must be at least 1, got {args.prefix_tokens}")
    if not 0 < args.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], e.g. {ASSUMED_MFU}, got {args.mfu}")
    link = flags.link(args.link)
    kv_dtype = flags.dtype("--kv-dtype", args.kv_dtype)
    try:
        gpu = get_gpu(args.gpu)
    except KeyError as err:
        raise UsageError(f"--gpu: {err.args[0]}") from None
    cfg = flags.model(args.model)
    tp = flags.tp(cfg, "--tp", args.tp)
    bw = link.bytes_per_s
    try:
        reload = reload_s(cfg, args.prefix_tokens, bw, tp=tp, kv_dtype=kv_dtype,
                          setup_s=link.setup_s)
        recompute = recompute_s(cfg, gpu, args.prefix_tokens, mfu=args.mfu, tp=tp,
                                kv_dtype=kv_dtype)
        limit = max(args.prefix_tokens, cfg.max_position_embeddings or args.prefix_tokens)
        even = break_even_tokens(cfg, gpu, bw, max_tokens=limit, mfu=args.mfu, tp=tp,
                                 kv_dtype=kv_dtype, setup_s=link.setup_s)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return ReloadReport(
        model=cfg.name, gpu=gpu.name, link=link.name, tp=tp, mfu=args.mfu, kv_dtype=kv_dtype,
        prefix_tokens=args.prefix_tokens, bytes_per_s=bw, link_source=link.source,
        measured_bytes_per_s=link.measured_bytes_per_s,
        reload_bytes=kv_bytes_per_gpu(cfg, args.prefix_tokens, kv_dtype, tp),
        reload_s=reload, recompute_s=recompute, reload_wins=reload <= recompute,
        break_even_tokens=even.tokens, recompute_wins_from=even.recompute_wins_from,
        recompute_wins_to_max=even.recompute_wins_to_max, max_tokens=even.max_tokens,
    )


def _verdict(r: ReloadReport) -> str:
    if r.recompute_wins_from is None:
        return f"reload wins at every prefix length up to {r.max_tokens:,} tokens"
    if r.recompute_wins_to_max:
        return (f"recompute wins from {r.recompute_wins_from:,} tokens up to "
                f"{r.max_tokens:,}")
    return (f"recompute wins from {r.recompute_wins_from:,} to "
            f"{r.break_even_tokens - 1:,} tokens; reload from {r.break_even_tokens:,}"
            if r.break_even_tokens is not None else "")


def render(r: ReloadReport) -> str:
    """The human-readable lines."""
    measured = ("" if r.measured_bytes_per_s is None
                else f", {r.measured_bytes_per_s / 1e9:,.1f} GB/s measured")
    rows = [
        ("model", f"{r.model} on {r.gpu}" + (f" (tp={r.tp}, per GPU)" if r.tp > 1 else "")),
        ("link", f"{r.link}: {r.bytes_per_s / 1e9:,.2f} GB/s datasheet{measured}"),
        ("prefix", f"{r.prefix_tokens:,} tokens, {r.reload_bytes / 1e9:,.3f} GB on each GPU"),
        ("reload", f"{r.reload_s * 1e3:,.3f} ms"),
        ("recompute", f"{r.recompute_s * 1e3:,.3f} ms at MFU {r.mfu:g} (step model)"),
        ("faster", "reload" if r.reload_wins else "recompute"),
        ("break-even", _verdict(r)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
