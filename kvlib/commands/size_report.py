"""What ``kvlib size`` reports: one dataclass, built by :mod:`kvlib.commands.size` and
printed by :mod:`kvlib.commands.size_render` (its own module, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SizeReport"]


@dataclass(frozen=True)
class SizeReport:
    """Everything ``kvlib size`` prints; ``--json`` prints these fields (bytes are ints).

    Fields that need a GPU (or ``--kv-memory``) are None without one.
    """

    model: str
    model_type: str
    attention: str
    num_hidden_layers: int
    layer_kinds: dict[str, int]
    sliding_window_tokens: int | None
    num_key_value_heads: int
    head_dim: int
    context_tokens: int
    batch: int
    kv_dtype: str
    kv_bytes_per_token: int
    kv_bytes: int
    kv_bytes_batch: int
    param_count: int | None
    active_param_count: int | None
    param_count_note: str | None
    weight_dtype: str
    weight_format: str
    weight_bytes: int | None
    weight_note: str | None
    tp: int
    gpu: str | None
    gpu_memory_bytes: int | None
    gpu_memory_source: str | None
    gpu_memory_utilization: float | None
    weight_bytes_per_gpu: int | None
    min_gpus: int | None
    valid_tp_degrees: list[int] | None
    hbm_bandwidth_bytes_per_s: float | None
    kv_bytes_per_gpu: int
    free_kv_bytes_per_gpu: int | None
    fits: bool | None
    seats: int | None
    decode_bytes_per_gpu: int | None
    decode_tokens_per_s_bound: float | None
    block_size: int
    page_bytes: int | None
    blocks_per_sequence: int | None
    pool_blocks: int | None
    pool_tokens: int | None
    max_concurrency: float | None
    notes: list[str]
