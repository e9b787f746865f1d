"""Deployment arithmetic: tensor parallelism, GPUs needed, and the time bounds of serving.

Cache bytes come from :mod:`kvlib.sizing` and weight bytes from
:mod:`kvlib.params`; this module splits them across ``tp`` GPUs and turns
bytes and FLOPs into seconds with a card's bandwidth and compute
(:mod:`kvlib.hardware`).
"""

from __future__ import annotations

import math

from kvlib.config import LayerSpec, ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.params import weight_bytes
from kvlib.sizing import _check_positive, _check_tokens, kv_bytes_by_layer, max_context_tokens

__all__ = [
    "decode_tokens_per_s",
    "kv_bytes_per_gpu",
    "kv_exceeds_weights_at_tokens",
    "min_gpus",
    "prefill_seconds",
    "valid_tp_degrees",
]


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
