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

import math
from typing import Literal

from kvlib.config import LayerSpec, ModelConfig
from kvlib.dtypes import bytes_for, check_dtype
from kvlib.hardware import GPUSpec
from kvlib.params import active_param_count, param_count

MLALayout = Literal["latent", "decompressed"]

__all__ = [
    "active_param_count",
    "decode_tokens_per_s",
    "kv_bytes",
    "kv_bytes_by_layer",
    "kv_bytes_per_token",
    "kv_bytes_per_token_dense",
    "kv_bytes_per_token_per_layer",
    "kv_bytes_per_gpu",
    "kv_exceeds_weights_at_tokens",
    "max_context_tokens",
    "min_gpus",
    "param_count",
    "prefill_seconds",
    "seats",
    "seats_for_context",
    "tokens_held",
    "valid_tp_degrees",
    "weight_bytes",
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


def weight_bytes(cfg: ModelConfig, weight_dtype: str = "bf16") -> int:
    """``param_count x bits / 8``: 2 bytes a parameter at bf16, 1 at fp8/int8, 0.5 at int4.

    Quantization scales (a few percent at 4-bit) are not included.
    """
    return bytes_for(param_count(cfg), weight_dtype)


def kv_exceeds_weights_at_tokens(
    cfg: ModelConfig, kv_dtype: str = "bf16", weight_dtype: str = "bf16"
) -> int | None:
    """Smallest context at which one sequence's cache outweighs the weights.

    None when the cache never gets there (every layer slides and the capped
    cache stays lighter than the weights).
    """
    weights = weight_bytes(cfg, weight_dtype)
    limit = max_context_tokens(cfg, weights, 1, kv_dtype)
    return None if limit is None else limit + 1


def prefill_seconds(num_params: int, prompt_tokens: int, flops_per_s: float) -> float:
    """``2 x P x T / F``: about 2 FLOPs per (active) parameter per prompt token.

    Leaves out attention's own T^2 term, small next to the weights below a
    few thousand tokens. Use an achievable ``flops_per_s`` (a fraction of the
    datasheet peak), not the peak itself.
    """
    _check_positive("num_params", num_params)
    _check_tokens(prompt_tokens, "prompt_tokens")
    if not flops_per_s > 0:
        raise ValueError(f"flops_per_s must be positive, got {flops_per_s!r}")
    return 2 * num_params * prompt_tokens / flops_per_s


def decode_tokens_per_s(bytes_read_per_step: int, bandwidth_bytes_per_s: float) -> float:
    """Upper bound on one sequence's decode speed: ``bandwidth / bytes read per step``.

    Each step reads every weight (and the batch's KV cache) from memory once,
    so a memory-bound step cannot be faster. The course brief's example: 4 GB
    of int4 weights through 1,008 GB/s give 252 tokens/s.
    """
    _check_positive("bytes_read_per_step", bytes_read_per_step)
    if not bandwidth_bytes_per_s > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be positive, got {bandwidth_bytes_per_s!r}")
    return bandwidth_bytes_per_s / bytes_read_per_step


def valid_tp_degrees(cfg: ModelConfig, max_tp: int = 8) -> list[int]:
    """Tensor-parallel degrees up to ``max_tp`` that split the heads evenly.

    vLLM requires ``num_attention_heads % tp == 0``; KV heads are split when
    ``num_key_value_heads % tp == 0`` and replicated when ``tp % num_key_value_heads == 0``.
    """
    _check_positive("max_tp", max_tp)
    kv_heads = {
        layer.num_key_value_heads for layer in cfg.layers if layer.kind not in ("mla", "linear")
    }
    return [
        tp
        for tp in range(1, max_tp + 1)
        if cfg.num_attention_heads % tp == 0 and all(h % tp == 0 or tp % h == 0 for h in kv_heads)
    ]


def kv_bytes_per_gpu(
    cfg: ModelConfig, context_tokens: int, kv_dtype: str = "bf16", tp: int = 1
) -> int:
    """Cache bytes one sequence of ``context_tokens`` puts on each of ``tp`` GPUs.

    Standard attention splits the KV heads (``H_kv / tp`` each; one each,
    replicated, once ``tp`` exceeds ``H_kv``); an MLA latent has no heads to
    split and is replicated on every GPU (vLLM's MLA backends).
    """
    if tp not in valid_tp_degrees(cfg, max_tp=tp):
        raise ValueError(
            f"tp={tp} does not split the {cfg.num_attention_heads} attention heads and "
            f"{cfg.num_key_value_heads} KV heads of {cfg.name}: use one of "
            f"{valid_tp_degrees(cfg, max_tp=max(tp, 8))}"
        )
    by_layer = kv_bytes_by_layer(cfg, context_tokens, kv_dtype)
    total = 0
    for layer, layer_bytes in zip(cfg.layers, by_layer, strict=True):
        numerator, denominator = _share_per_gpu(layer, tp)
        total += layer_bytes * numerator // denominator
    return total


def _share_per_gpu(layer: LayerSpec, tp: int) -> tuple[int, int]:
    """The fraction of a layer's cache each GPU holds, as (numerator, denominator).

    KV heads split ``max(1, H_kv / tp)`` of ``H_kv``; an MLA latent is whole on
    every GPU; a linear-attention state splits with its heads, ``1 / tp``.
    """
    if layer.kind == "mla":
        return 1, 1
    if layer.kind == "linear":
        return 1, tp
    if layer.kind == "shared":
        return 0, 1
    return max(1, layer.num_key_value_heads // tp), layer.num_key_value_heads


def min_gpus(
    cfg: ModelConfig,
    gpu: GPUSpec,
    weight_dtype: str = "bf16",
    gpu_memory_utilization: float = 0.9,
    max_tp: int = 64,
) -> int | None:
    """Smallest valid tensor-parallel degree whose GPUs hold the weights with room to spare.

    Each GPU gives ``memory x utilization`` (vLLM's ``gpu_memory_utilization``);
    the weights split ``1 / tp`` per GPU and something must be left for the KV
    cache. None if no valid degree up to ``max_tp`` fits.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
        )
    usable = gpu.memory_bytes * gpu_memory_utilization
    weights = weight_bytes(cfg, weight_dtype)
    lower = math.ceil(weights / usable)
    for tp in valid_tp_degrees(cfg, max_tp):
        if tp >= lower and weights / tp < usable:
            return tp
    return None


def _check_tokens(value: int, name: str = "context_tokens") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
