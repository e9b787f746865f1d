"""KV cache bytes, seats and context limits from a model's architecture.

The core formula, per token and per layer of standard (MHA/GQA/MQA) attention::

    2 (K and V) x num_key_value_heads x head_dim x bytes_per_element

Every layer's cache is a spec (:mod:`kvlib.specs`) that knows its own bytes
per token and how many tokens it keeps (a sliding window its last ``W - 1``;
an MLA latent, ``kv_lora_rank + qk_rope_head_dim`` elements a token with no
factor 2); this module sums over layers.
"""

from __future__ import annotations

from typing import Literal

from kvlib._validate import is_int, require_int
from kvlib.config import ModelConfig
from kvlib.dtypes import require_dtype
from kvlib.specs import CacheSpec

MLALayout = Literal["latent", "decompressed"]

__all__ = [
    "MLALayout",
    "kv_bytes",
    "kv_bytes_by_layer",
    "kv_bytes_per_token",
    "kv_bytes_per_token_dense",
    "kv_bytes_per_token_per_layer",
    "layer_specs",
    "max_context_tokens",
    "summed_page_bytes",
    "seats",
    "seats_for_context",
    "tokens_held",
]


def kv_bytes_per_token_dense(
    num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: float
) -> int:
    """``2 x L x H_kv x d x b``: bytes one token occupies in a full-attention cache.

    ``bytes_per_element`` may be 0.5 for a 4-bit cache.
    """
    require_int(num_layers, "num_layers", 1)
    require_int(num_kv_heads, "num_kv_heads", 1)
    require_int(head_dim, "head_dim", 1)
    if not bytes_per_element > 0:
        raise ValueError(f"bytes_per_element must be positive, got {bytes_per_element!r}")
    total = 2 * num_layers * num_kv_heads * head_dim * bytes_per_element
    if total != int(total):
        raise ValueError(f"{total} is not a whole number of bytes: check bytes_per_element")
    return int(total)


def layer_specs(cfg: ModelConfig, mla_layout: MLALayout = "latent") -> tuple[CacheSpec, ...]:
    """The cache spec of every layer; ``"decompressed"`` expands MLA latents into the
    per-head keys and values transformers 4.x cached."""
    if mla_layout == "latent":
        return cfg.layers
    if mla_layout == "decompressed":
        return tuple(layer.decompressed() for layer in cfg.layers)
    raise ValueError(f"mla_layout must be 'latent' or 'decompressed', got {mla_layout!r}")


def _layer(cfg: ModelConfig, layer: int, mla_layout: MLALayout) -> CacheSpec:
    if not is_int(layer):
        raise TypeError(f"layer must be an int index, got {type(layer).__name__}")
    if not 0 <= layer < cfg.num_hidden_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_hidden_layers}), got {layer}")
    return layer_specs(cfg, mla_layout)[layer]


def kv_bytes_per_token_per_layer(
    cfg: ModelConfig, layer: int, kv_dtype: str = "bf16", *, mla_layout: MLALayout = "latent"
) -> int:
    """Bytes one token adds to layer ``layer`` (0-based) while under its window."""
    return _layer(cfg, layer, mla_layout).bytes_per_token(kv_dtype)


def kv_bytes_per_token(
    cfg: ModelConfig, kv_dtype: str = "bf16", *, mla_layout: MLALayout = "latent"
) -> int:
    """Bytes one more token costs, summed over all layers, while under every window."""
    require_dtype(kv_dtype)
    return sum(spec.bytes_per_token(kv_dtype) for spec in layer_specs(cfg, mla_layout))


def tokens_held(cfg: ModelConfig, layer: int, context_tokens: int) -> int:
    """Tokens that layer ``layer`` keeps of a sequence: ``min(T, W - 1)`` if it slides, else T."""
    return _layer(cfg, layer, "latent").tokens_held(context_tokens)


def kv_bytes_by_layer(
    cfg: ModelConfig,
    context_tokens: int,
    kv_dtype: str = "bf16",
    *,
    mla_layout: MLALayout = "latent",
) -> list[int]:
    """Bytes each layer holds for one sequence of ``context_tokens``
    (:meth:`kvlib.specs.CacheSpec.bytes_for_context`)."""
    require_int(context_tokens, "context_tokens")
    return [
        spec.bytes_for_context(context_tokens, kv_dtype) for spec in layer_specs(cfg, mla_layout)
    ]


def kv_bytes(
    cfg: ModelConfig,
    context_tokens: int,
    kv_dtype: str = "bf16",
    *,
    batch: int = 1,
    mla_layout: MLALayout = "latent",
) -> int:
    """Bytes held for ``batch`` sequences of ``context_tokens`` each, sliding layers capped."""
    require_int(batch, "batch", 1)
    return batch * sum(kv_bytes_by_layer(cfg, context_tokens, kv_dtype, mla_layout=mla_layout))


def summed_page_bytes(cfg: ModelConfig, block_size: int = 16, kv_dtype: str = "bf16") -> int:
    """One block of ``block_size`` tokens across every layer: each layer's page
    (:meth:`kvlib.specs.CacheSpec.page_bytes`), summed.

    Every layer counted at ``block_size`` tokens, as if one block id held every
    layer; on a hybrid model vLLM unifies page sizes first
    (:func:`kvlib.paging.vllm_pool.unified_page_bytes`), which can differ.
    """
    return sum(spec.page_bytes(block_size, kv_dtype) for spec in cfg.layers)


def seats(free_bytes: int, bytes_per_seat: int) -> int:
    """Whole sequences that fit: ``floor(free_bytes / bytes_per_seat)``."""
    require_int(free_bytes, "free_bytes")
    require_int(bytes_per_seat, "bytes_per_seat", 1)
    return free_bytes // bytes_per_seat


def seats_for_context(
    cfg: ModelConfig, free_bytes: int, context_tokens: int, kv_dtype: str = "bf16"
) -> int:
    """Sequences of ``context_tokens`` whose caches fit in ``free_bytes``.

    The worst case: every sequence holds (or reserves) the whole context.
    """
    require_int(context_tokens, "context_tokens", 1)
    return seats(free_bytes, kv_bytes(cfg, context_tokens, kv_dtype))


def max_context_tokens(
    cfg: ModelConfig, free_bytes: int, batch: int = 1, kv_dtype: str = "bf16"
) -> int | None:
    """Longest context each of ``batch`` sequences can reach within ``free_bytes``.

    The cache is ``sum_l b_l x min(T, cap_l) + fixed``: it grows by
    ``kv_bytes_per_token`` a token until the first window fills, then only the
    layers still under their cap keep growing. Returns None when every layer
    is capped and the capped cache fits: then KV memory sets no limit (the
    model's position limit still does).
    """
    require_int(free_bytes, "free_bytes")
    require_int(batch, "batch", 1)
    budget = free_bytes // batch - sum(spec.fixed_bytes(kv_dtype) for spec in cfg.layers)
    if budget < 0:
        return 0
    slopes = [(spec.cap_tokens, spec.bytes_per_token(kv_dtype)) for spec in cfg.layers]
    start_tokens, used_bytes = 0, 0
    slope = sum(per_token for _, per_token in slopes)
    for cap in sorted({c for c, _ in slopes if c is not None}) + [None]:
        if slope > 0:
            tokens = start_tokens + (budget - used_bytes) // slope
            # At exactly the cap, what is left may still buy tokens for the layers
            # that keep growing past it: only a limit short of the cap is final.
            if cap is None or tokens < cap:
                return tokens
        if cap is None:
            return None
        # Past this cap, the layers it bounds stop growing.
        used_bytes += slope * (cap - start_tokens)
        start_tokens = cap
        slope -= sum(per_token for c, per_token in slopes if c == cap)
    return None
