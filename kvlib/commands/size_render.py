"""The human-readable table of ``kvlib size`` (the JSON is the report's fields)."""

from __future__ import annotations

from kvlib.commands.size_report import SizeReport
from kvlib.units import format_bytes, format_rate

__all__ = ["render"]


def _bytes(n: int | None, exact: bool = False) -> str:
    if n is None:
        return "unknown"
    return f"{format_bytes(n)} ({n:,} B)" if exact else format_bytes(n)


def _model_rows(r: SizeReport) -> list[tuple[str, str]]:
    layers = f"{r.num_hidden_layers}"
    if len(r.layer_kinds) > 1:
        layers += ": " + ", ".join(f"{count} {kind}" for kind, count in r.layer_kinds.items())
    if r.sliding_window_tokens:
        layers += f" (window {r.sliding_window_tokens:,} tokens)"
    params = "unknown" if r.param_count is None else f"{r.param_count / 1e9:,.2f} B"
    if r.param_count is not None and r.active_param_count not in (None, r.param_count):
        params += f" ({(r.active_param_count or 0) / 1e9:,.2f} B active a token)"
    weights = f"weights ({r.weight_format})"
    return [
        ("model", f"{r.model} ({r.attention})"),
        ("layers", layers),
        ("KV heads x head dim", f"{r.num_key_value_heads} x {r.head_dim}"),
        (f"KV per token ({r.kv_dtype})", _bytes(r.kv_bytes_per_token, exact=True)),
        (f"KV for {r.context_tokens:,} tokens", _bytes(r.kv_bytes, exact=True)),
        (f"KV for batch of {r.batch}", _bytes(r.kv_bytes_batch)),
        ("parameters", params),
        (weights, _bytes(r.weight_bytes)),
    ]


def _gpu_rows(r: SizeReport) -> list[tuple[str, str]]:
    if r.gpu is None:
        return []
    return [
        (
            "GPU",
            f"{r.gpu} x {r.tp}, {_bytes(r.gpu_memory_bytes)} each (driver), "
            f"{r.gpu_memory_utilization:.0%} usable",
        ),
        ("weights per GPU", _bytes(r.weight_bytes_per_gpu)),
        ("min GPUs for weights", "unknown" if r.min_gpus is None else str(r.min_gpus)),
        ("valid TP degrees", ", ".join(map(str, r.valid_tp_degrees or []))),
    ]


def _seat_rows(r: SizeReport) -> list[tuple[str, str]]:
    rows = []
    if r.free_kv_bytes_per_gpu is not None:
        rows += [
            ("free for KV per GPU", _bytes(r.free_kv_bytes_per_gpu)),
            ("KV per sequence per GPU", _bytes(r.kv_bytes_per_gpu)),
            (f"seats at {r.context_tokens:,} tokens", str(r.seats)),
        ]
    if r.decode_tokens_per_s_bound is not None and r.hbm_bandwidth_bytes_per_s is not None:
        rows.append(
            (
                f"decode bound at batch {r.batch}",
                f"{r.decode_tokens_per_s_bound:,.1f} tokens/s a sequence "
                f"({_bytes(r.decode_bytes_per_gpu)} a step at "
                f"{format_rate(r.hbm_bandwidth_bytes_per_s)})",
            )
        )
    return rows


def _pool_rows(r: SizeReport) -> list[tuple[str, str]]:
    if r.page_bytes is None:
        return []
    rows = [(f"page ({r.block_size} tokens, all layers)", _bytes(r.page_bytes, exact=True))]
    rows.append((f"blocks for {r.context_tokens:,} tokens", f"{r.blocks_per_sequence:,}"))
    if r.pool_blocks is not None and r.max_concurrency is not None:
        rows += [
            ("pool (vLLM)", f"{r.pool_blocks:,} blocks = {r.pool_tokens:,} tokens"),
            ("max concurrency (vLLM)", f"{r.max_concurrency:.2f}x at {r.context_tokens:,} tokens"),
        ]
    return rows


def render(report: SizeReport) -> str:
    """The table: one row a figure, then notes on what the figures assume."""
    rows = _model_rows(report) + _gpu_rows(report) + _seat_rows(report) + _pool_rows(report)
    if report.fits is False:
        rows.append(("warning", "the weights do not fit: raise --tp or lower --weight-dtype"))
    # The weights are unknown because the parameter count is: one reason, said once.
    for note in dict.fromkeys((report.param_count_note, report.weight_note)):
        if note:
            rows.append(("unknown because", note))
    rows += [("note", note) for note in report.notes]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
