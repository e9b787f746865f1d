"""KV cache bytes, seats and context limits from a model's architecture.

The core formula, per token and per layer of standard (MHA/GQA/MQA) attention::

    2 (K and V) x num_key_value_heads x head_dim x bytes_per_element

A sliding-window layer keeps at most ``sliding_window - 1`` past tokens: the
next token attends to itself and the ``W - 1`` before it, so older keys are
dropped (``DynamicSlidingWindowLayer`` in transformers' ``cache_utils.py``
slices ``[-sliding_window + 1:]``; vLLM's sliding-window manager frees blocks
before the same point). An MLA layer caches one latent of
``kv_lora_rank + qk_rope_head_dim`` elements per token, with no factor 2
(vLLM's ``MLAAttentionSpec``; DeepSeek-V2 paper, section 2.1).
"""

from __future__ import annotations

from typing import Literal

from kvlib.config import LayerSpec, ModelConfig
from kvlib.dtypes import bytes_for, check_dtype

MLALayout = Literal["latent", "decompressed"]

__all__ = [
    "kv_bytes",
    "kv_bytes_by_layer",
    "kv_bytes_per_token",
    "kv_bytes_per_token_dense",
    "kv_bytes_per_token_per_layer",
    "max_context_tokens",
    "seats",
    "seats_for_context",
    "state_bytes",
    "tokens_held",
]


def kv_bytes_per_token_dense(
    num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: float
) -> int:
    """``2 x L x H_kv x d x b``: bytes one token occupies in a full-attention cache.

    ``bytes_per_element`` may be 0.5 for a 4-bit cache. The course brief's
    example: ``kv_bytes_per_token_dense(40, 8, 128, 2) == 163840`` (160 KiB).
    """
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not bytes_per_element > 0:
        raise ValueError(f"bytes_per_element must be positive, got {bytes_per_element!r}")
    total = 2 * num_layers * num_kv_heads * head_dim * bytes_per_element
    if total != int(total):
        raise ValueError(f"{total} is not a whole number of bytes: check bytes_per_element")
    return int(total)


def _elements_per_token(cfg: ModelConfig, layer: LayerSpec, mla_layout: MLALayout) -> int:
    """Cached elements per token in one layer (a linear-attention state does not grow)."""
    if layer.kind in ("shared", "linear"):
        return 0
    if layer.kind != "mla":
        return 2 * layer.num_key_value_heads * layer.head_dim
    if cfg.mla is None:
        raise ValueError(f"{cfg.name} has no MLA fields but a layer is marked 'mla'")
    if mla_layout == "latent":
        return cfg.mla.latent_dim + layer.indexer_dim
    if mla_layout == "decompressed":
        # Per-head keys (nope + rope) and values for every query head.
        heads = cfg.num_attention_heads * (cfg.mla.qk_head_dim + cfg.mla.v_head_dim)
        return heads + layer.indexer_dim
    raise ValueError(f"mla_layout must be 'latent' or 'decompressed', got {mla_layout!r}")


def kv_bytes_per_token_per_layer(
    cfg: ModelConfig, layer: int, kv_dtype: str = "bf16", *, mla_layout: MLALayout = "latent"
) -> int:
    """Bytes one token adds to layer ``layer`` (0-based) while under its window."""
    if not 0 <= layer < cfg.num_hidden_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_hidden_layers}), got {layer}")
    elements = _elements_per_token(cfg, cfg.layers[layer], mla_layout)
    return bytes_for(elements, kv_dtype)


def kv_bytes_per_token(
    cfg: ModelConfig, kv_dtype: str = "bf16", *, mla_layout: MLALayout = "latent"
) -> int:
    """Bytes one more token costs, summed over all layers, while under every window."""
    check_dtype(kv_dtype)
    return sum(
        kv_bytes_per_token_per_layer(cfg, i, kv_dtype, mla_layout=mla_layout)
        for i in range(cfg.num_hidden_layers)
    )


def tokens_held(cfg: ModelConfig, layer: int, context_tokens: int) -> int:
    """Tokens that layer ``layer`` keeps of a sequence: ``min(T, W - 1)`` if it slides, else T."""
    _check_tokens(context_tokens)
    cap = _cap(cfg.layers[layer])
    return context_tokens if cap is None else min(context_tokens, cap)


def _cap(layer: LayerSpec) -> int | None:
    """Most tokens a layer keeps: ``W - 1`` for a window or chunk, else unbounded (None)."""
    return None if layer.window is None else layer.window - 1


def state_bytes(layer: LayerSpec, kv_dtype: str = "bf16") -> int:
    """Fixed bytes of a linear-attention layer: conv state in ``kv_dtype``, recurrent in fp32."""
    return bytes_for(layer.conv_state_elements, kv_dtype) + 4 * layer.recurrent_state_elements


def kv_bytes_by_layer(
    cfg: ModelConfig,
    context_tokens: int,
    kv_dtype: str = "bf16",
    *,
    mla_layout: MLALayout = "latent",
) -> list[int]:
    """Bytes each layer holds for one sequence of ``context_tokens``.

    ``tokens held x bytes per token``, plus a linear-attention layer's fixed
    state once the sequence has a token.
    """
    return [
        tokens_held(cfg, i, context_tokens)
        * kv_bytes_per_token_per_layer(cfg, i, kv_dtype, mla_layout=mla_layout)
        + (state_bytes(layer, kv_dtype) if context_tokens else 0)
        for i, layer in enumerate(cfg.layers)
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
    _check_positive("batch", batch)
    return batch * sum(kv_bytes_by_layer(cfg, context_tokens, kv_dtype, mla_layout=mla_layout))


def seats(free_bytes: int, bytes_per_seat: int) -> int:
    """Whole sequences that fit: ``floor(free_bytes / bytes_per_seat)``.

    The course brief's card: 9 GiB free, 640 MiB a seat, gives 14 (the 15th fails).
    """
    _check_tokens(free_bytes, "free_bytes")
    _check_positive("bytes_per_seat", bytes_per_seat)
    return free_bytes // bytes_per_seat


def seats_for_context(
    cfg: ModelConfig, free_bytes: int, context_tokens: int, kv_dtype: str = "bf16"
) -> int:
    """Sequences of ``context_tokens`` whose caches fit in ``free_bytes``."""
    _check_positive("context_tokens", context_tokens)
    return seats(free_bytes, kv_bytes(cfg, context_tokens, kv_dtype))


def max_context_tokens(
    cfg: ModelConfig, free_bytes: int, batch: int = 1, kv_dtype: str = "bf16"
) -> int | None:
    """Longest context each of ``batch`` sequences can reach within ``free_bytes``.

    The cache is ``sum_l b_l x min(T, cap_l)``: it grows by ``kv_bytes_per_token``
    a token until the first window fills, then only the layers still under
    their cap keep growing. Returns None when every layer is capped and the
    capped cache fits: then KV memory sets no limit (the model's position
    limit still does).
    """
    _check_tokens(free_bytes, "free_bytes")
    _check_positive("batch", batch)
    budget = free_bytes // batch - sum(state_bytes(layer, kv_dtype) for layer in cfg.layers)
    if budget < 0:
        return 0
    slopes = [
        (_cap(layer), kv_bytes_per_token_per_layer(cfg, i, kv_dtype))
        for i, layer in enumerate(cfg.layers)
    ]
    start_tokens, used_bytes = 0, 0
    slope = sum(per_token for _, per_token in slopes)
    for cap in sorted({c for c, _ in slopes if c is not None}) + [None]:
        if slope > 0:
            tokens = start_tokens + (budget - used_bytes) // slope
            if cap is None or tokens <= cap:
                return tokens
        if cap is None:
            return None
        # Past this cap, the layers it bounds stop growing.
        used_bytes += slope * (cap - start_tokens)
        start_tokens = cap
        slope -= sum(per_token for c, per_token in slopes if c == cap)
    return None


def _check_tokens(value: int, name: str = "context_tokens") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
