"""``kvlib handoff MODEL``: the cache one request hands from prefill GPUs to decode GPUs,
who sends which bytes, and how long it takes over a link."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kvlib.commands import UsageError, emit, fail, flags
from kvlib.config import ConfigError
from kvlib.tiers.handoff import handoff, transfer_s
from kvlib.tiers.links import link_names

__all__ = ["HandoffReport", "handoff_report", "register", "render"]


@dataclass(frozen=True)
class HandoffReport:
    """Everything ``kvlib handoff`` prints; ``--json`` prints these fields."""

    model: str
    link: str
    kv_dtype: str
    prompt_tokens: int
    prefill_tp: int
    decode_tp: int
    bytes_per_s: float  # the link's datasheet rate, one direction, each GPU's own link
    transfer_bytes: int  # the request's whole cache: every layer, K and V
    bytes_per_gpu_pair: dict[str, int]  # "i->j": prefill GPU i to decode GPU j
    wire_bytes: int
    busiest_gpu_bytes: int
    transfer_s: float


def register(commands: Any) -> None:
    """Add ``kvlib handoff`` to the subcommands."""
    cmd = commands.add_parser(
        "handoff",
        help="bytes and time of one request's cache from prefill GPUs to decode GPUs",
        description="The cache of a --prompt-tokens prompt (every layer, K and V) moved from "
        "a --prefill-tp group to a --decode-tp group: which prefill GPU sends which KV heads "
        "to which decode GPU, and the time over --link, each GPU on its own link.",
    )
    cmd.add_argument("model", help="path to a config.json (or its folder), a bundled name, "
                     "or a Hugging Face model id")
    cmd.add_argument("--prompt-tokens", type=int, required=True, help="tokens of the prompt")
    cmd.add_argument("--link", required=True, help=f"one of {', '.join(link_names())}")
    cmd.add_argument("--prefill-tp", type=int, default=1, help="prefill GPUs (1)")
    cmd.add_argument("--decode-tp", type=int, default=1, help="decode GPUs (1)")
    cmd.add_argument("--kv-dtype", default="bf16", help="KV element type (bf16)")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the hand-off report; exit status 2 with one line on bad input."""
    try:
        report = handoff_report(args)
    except (ConfigError, UsageError) as exc:
        return fail("handoff", str(exc.args[0]) if exc.args else str(exc))
    return emit(report, args.json, render)


def handoff_report(args: argparse.Namespace) -> HandoffReport:
    """The report for parsed ``kvlib handoff`` arguments; UsageError/ConfigError on bad input."""
    if args.prompt_tokens < 1:
        raise UsageError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    link = flags.link(args.link)
    kv_dtype = flags.dtype("--kv-dtype", args.kv_dtype)
    cfg = flags.model(args.model)
    a = flags.tp(cfg, "--prefill-tp", args.prefill_tp)
    b = flags.tp(cfg, "--decode-tp", args.decode_tp)
    try:
        plan = handoff(cfg, args.prompt_tokens, prefill_tp=a, decode_tp=b, kv_dtype=kv_dtype)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return HandoffReport(
        model=cfg.name, link=link.name, kv_dtype=kv_dtype, prompt_tokens=args.prompt_tokens,
        prefill_tp=a, decode_tp=b, bytes_per_s=link.bytes_per_s,
        transfer_bytes=plan.transfer_bytes, bytes_per_gpu_pair=plan.bytes_per_gpu_pair,
        wire_bytes=plan.wire_bytes, busiest_gpu_bytes=plan.busiest_gpu_bytes,
        transfer_s=transfer_s(plan, link.bytes_per_s, link.setup_s),
    )


def render(r: HandoffReport) -> str:
    """The human-readable lines, one per GPU pair."""
    rows = [
        ("model", f"{r.model}, {r.prompt_tokens:,} prompt tokens, KV {r.kv_dtype}"),
        ("GPUs", f"prefill tp={r.prefill_tp} -> decode tp={r.decode_tp}"),
        ("cache", f"{r.transfer_bytes:,} bytes (every layer, K and V)"),
        ("on the wire", f"{r.wire_bytes:,} bytes; busiest GPU {r.busiest_gpu_bytes:,}"),
        ("link", f"{r.link}: {r.bytes_per_s / 1e9:,.2f} GB/s a GPU, one direction"),
        ("transfer", f"{r.transfer_s * 1e3:,.3f} ms"),
    ]
    rows += [(f"GPU {pair}", f"{n:,} bytes") for pair, n in r.bytes_per_gpu_pair.items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
