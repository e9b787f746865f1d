"""``kvlib size CONFIG``: KV cache, weights and seats for a model config."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvlib import deploy, params, sizing
from kvlib.commands import UsageError, fail
from kvlib.config import ConfigError, ModelConfig, bundled_models, load_config
from kvlib.dtypes import DTYPE_BITS, check_dtype
from kvlib.hardware import GPUSpec, get_gpu, gpu_names
from kvlib.units import format_bytes, format_rate, parse_bytes

__all__ = ["register", "render", "size_report"]


def register(commands: Any) -> None:
    """Add ``kvlib size`` to the subcommands."""
    size = commands.add_parser(
        "size",
        help="KV cache, weights and seats for a model config",
        description="Size a model's KV cache from its config.json, and how many "
        f"sequences fit on a GPU. Bundled configs: {', '.join(bundled_models())}.",
    )
    size.add_argument("config", help="path to a config.json (or its folder), or a bundled name")
    size.add_argument("--context", type=int, default=4096, help="tokens per sequence (4096)")
    size.add_argument("--batch", type=int, default=1, help="concurrent sequences (1)")
    dtypes = list(DTYPE_BITS)
    size.add_argument("--kv-dtype", default="bf16", help=f"KV element type: {', '.join(dtypes)}")
    size.add_argument("--weight-dtype", default="bf16", help="weight element type (bf16)")
    size.add_argument("--gpu", help=f"one of {', '.join(gpu_names())}")
    size.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of GPU memory for weights and cache, as in vLLM (0.9)",
    )
    size.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (1)")
    size.add_argument(
        "--kv-memory", help="free memory for the cache per GPU, e.g. '9 GiB' (else from --gpu)"
    )
    size.add_argument("--json", action="store_true", help="print one JSON object")
    size.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the size report; exit status 2 with one line on bad input."""
    try:
        report = size_report(args)
    except (ConfigError, UsageError, ValueError, KeyError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        return fail("size", message)
    try:
        print(json.dumps(report, indent=2) if args.json else render(report))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _checked(args: argparse.Namespace) -> tuple[ModelConfig, str, str]:
    if args.context < 1:
        raise UsageError(f"--context must be a positive number of tokens, got {args.context}")
    if args.batch < 1:
        raise UsageError(f"--batch must be at least 1, got {args.batch}")
    if args.tp < 1:
        raise UsageError(f"--tp must be at least 1, got {args.tp}")
    kv_dtype = _dtype("--kv-dtype", args.kv_dtype)
    weight_dtype = _dtype("--weight-dtype", args.weight_dtype)
    return load_config(args.config), kv_dtype, weight_dtype


def _dtype(flag: str, value: str) -> str:
    try:
        return check_dtype(value)
    except ValueError:
        known = ", ".join(DTYPE_BITS)
        raise UsageError(f"{flag} {value!r} is not a dtype: use one of {known}") from None


def size_report(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``kvlib size`` prints, as plain JSON-ready values (bytes are ints)."""
    cfg, kv_dtype, weight_dtype = _checked(args)
    report: dict[str, Any] = {
        "model": cfg.name,
        "attention": cfg.attention_type,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_sliding_layers": cfg.num_sliding_layers,
        "layer_kinds": {
            kind: cfg.layer_kinds.count(kind) for kind in dict.fromkeys(cfg.layer_kinds)
        },
        "sliding_window_tokens": cfg.sliding_window,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "context_tokens": args.context,
        "batch": args.batch,
        "kv_dtype": kv_dtype,
        "weight_dtype": weight_dtype,
        "kv_bytes_per_token": sizing.kv_bytes_per_token(cfg, kv_dtype),
        "kv_bytes": sizing.kv_bytes(cfg, args.context, kv_dtype),
        "kv_bytes_batch": sizing.kv_bytes(cfg, args.context, kv_dtype, batch=args.batch),
        "param_count": params.param_count(cfg),
        "weight_bytes": params.weight_bytes(cfg, weight_dtype),
    }
    gpu = get_gpu(args.gpu) if args.gpu else None
    if gpu is not None or args.kv_memory:
        report.update(_deployment(cfg, args, gpu, kv_dtype, weight_dtype))
    return report


def _deployment(
    cfg: ModelConfig,
    args: argparse.Namespace,
    gpu: GPUSpec | None,
    kv_dtype: str,
    weight_dtype: str,
) -> dict[str, Any]:
    """Seats, context and speed bounds on ``args.tp`` GPUs."""
    per_gpu_kv = deploy.kv_bytes_per_gpu(cfg, args.context, kv_dtype, args.tp)
    out: dict[str, Any] = {"tp": args.tp, "kv_bytes_per_gpu": per_gpu_kv}
    weights_per_gpu = -(-params.weight_bytes(cfg, weight_dtype) // args.tp)
    if gpu is not None:
        if not 0 < args.gpu_memory_utilization <= 1:
            raise UsageError("--gpu-memory-utilization must be in (0, 1], e.g. 0.9")
        usable = int(gpu.memory_bytes * args.gpu_memory_utilization)
        out.update(
            gpu=gpu.name,
            gpu_memory_bytes=gpu.memory_bytes,
            gpu_memory_utilization=args.gpu_memory_utilization,
            weight_bytes_per_gpu=weights_per_gpu,
            min_gpus=deploy.min_gpus(cfg, gpu, weight_dtype, args.gpu_memory_utilization),
            valid_tp_degrees=deploy.valid_tp_degrees(cfg),
            hbm_bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        )
        free = usable - weights_per_gpu
    if args.kv_memory:
        try:
            free = parse_bytes(args.kv_memory)
        except ValueError as exc:
            raise UsageError(f"--kv-memory: {exc}") from None
    out["free_kv_bytes_per_gpu"] = max(free, 0)
    out["fits"] = free > 0
    out["seats"] = sizing.seats(max(free, 0), per_gpu_kv)
    if gpu is not None and free > 0:
        step_bytes = weights_per_gpu + args.batch * per_gpu_kv
        out["decode_tokens_per_s_bound"] = deploy.decode_tokens_per_s(
            step_bytes, gpu.hbm_bandwidth_bytes_per_s
        )
    return out


def render(report: dict[str, Any]) -> str:
    """The human-readable table of a size report."""
    b = format_bytes
    window = report["sliding_window_tokens"]
    kinds = report["layer_kinds"]
    layers = f"{report['num_hidden_layers']}"
    if len(kinds) > 1:
        layers += ": " + ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    if window:
        layers += f" (window {window:,} tokens)"
    rows = [
        ("model", f"{report['model']} ({report['attention']})"),
        ("layers", layers),
        ("KV heads x head dim", f"{report['num_key_value_heads']} x {report['head_dim']}"),
        (
            f"KV per token ({report['kv_dtype']})",
            f"{b(report['kv_bytes_per_token'])} ({report['kv_bytes_per_token']:,} B)",
        ),
        (
            f"KV for {report['context_tokens']:,} tokens",
            f"{b(report['kv_bytes'])} ({report['kv_bytes']:,} B)",
        ),
        (f"KV for batch of {report['batch']}", b(report["kv_bytes_batch"])),
        ("parameters", f"{report['param_count'] / 1e9:,.2f} B"),
        (f"weights ({report['weight_dtype']})", b(report["weight_bytes"])),
    ]
    if "gpu" in report:
        rows += [
            (
                "GPU",
                f"{report['gpu']} x {report['tp']}, {b(report['gpu_memory_bytes'])} each, "
                f"{report['gpu_memory_utilization']:.0%} usable",
            ),
            ("weights per GPU", b(report["weight_bytes_per_gpu"])),
            ("min GPUs for weights", str(report["min_gpus"])),
            ("valid TP degrees", ", ".join(map(str, report["valid_tp_degrees"]))),
        ]
    if "seats" in report:
        rows += [
            ("free for KV per GPU", b(report["free_kv_bytes_per_gpu"])),
            ("KV per sequence per GPU", b(report["kv_bytes_per_gpu"])),
            (f"seats at {report['context_tokens']:,} tokens", str(report["seats"])),
        ]
    if "decode_tokens_per_s_bound" in report:
        rows.append(
            (
                "decode bound per sequence",
                f"{report['decode_tokens_per_s_bound']:,.1f} tokens/s "
                f"({format_rate(report['hbm_bandwidth_bytes_per_s'])})",
            )
        )
    if report.get("fits") is False:
        rows.append(("note", "the weights do not fit: raise --tp or lower --weight-dtype"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
