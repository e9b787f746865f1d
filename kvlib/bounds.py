"""Deployment arithmetic: tensor parallelism, GPUs needed, and the time bounds of serving.

Cache bytes come from :mod:`kvlib.sizing` and weight bytes from
:mod:`kvlib.weights.params`; this module splits them across ``tp`` GPUs and turns
bytes and FLOPs into seconds with a card's bandwidth and compute
(:mod:`kvlib.hardware`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib._validate import cdiv, require_fraction, require_int, require_positive
from kvlib.config import ModelConfig
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, GPUSpec, vllm_budget_bytes
from kvlib.sizing import kv_bytes_by_layer, max_context_tokens
from kvlib.specs import CacheSpec
from kvlib.weights.layouts import weight_groups
from kvlib.weights.params import expert_weight_bytes, unread_weight_bytes, weight_bytes

__all__ = [
    "PrefillFlops",
    "attention_pairs",
    "compute_bound_tokens",
    "decode_bytes_per_gpu",
    "decode_tokens_per_s",
    "expected_experts_touched",
    "kv_bytes_per_gpu",
    "kv_exceeds_weights_at_tokens",
    "matmul_params",
    "min_gpus",
    "prefill_attention_flops",
    "prefill_flops",
    "prefill_rule_of_thumb_s",
    "prefill_lower_bound_s",
    "valid_tp_degrees",
]


def kv_exceeds_weights_at_tokens(
    cfg: ModelConfig, kv_dtype: str = "bf16", weight_dtype: str | None = "bf16"
) -> int | None:
    """Smallest context at which one sequence's cache outweighs the weights.

    None when the cache never gets there (every layer slides and the capped
    cache stays lighter than the weights).
    """
    weights = weight_bytes(cfg, weight_dtype)
    limit = max_context_tokens(cfg, weights, 1, kv_dtype)
    return None if limit is None else limit + 1


def prefill_rule_of_thumb_s(num_params: int, prompt_tokens: int, flops_per_s: float) -> float:
    """``2 x P x T / F``: the rule of thumb, 2 FLOPs per (active) parameter per prompt token.

    Counts the LM head at every prompt token (an engine computes logits for the
    last one only) and leaves out attention, whose share grows with ``T`` (about
    8% of the weight FLOPs at 4,096 tokens for Llama-3.1-8B).
    :func:`prefill_flops` and :func:`prefill_lower_bound_s` count both. Use an
    achievable ``flops_per_s`` (a fraction of the datasheet peak), not the peak.
    """
    require_int(num_params, "num_params", 1)
    require_int(prompt_tokens, "prompt_tokens")
    require_positive(flops_per_s, "flops_per_s")
    return 2 * num_params * prompt_tokens / flops_per_s


def decode_tokens_per_s(bytes_read_per_step: int, bandwidth_bytes_per_s: float) -> float:
    """Upper bound on one sequence's decode speed: ``bandwidth / bytes read per step``.

    Each step reads every weight (and the batch's KV cache) from memory once,
    so a memory-bound step cannot be faster.
    """
    require_int(bytes_read_per_step, "bytes_read_per_step", 1)
    require_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    return bandwidth_bytes_per_s / bytes_read_per_step


def expected_experts_touched(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Experts a layer reads for ``tokens`` tokens routed uniformly at random:
    ``E x (1 - (1 - k / E) ** B)`` (each expert is missed by a token with
    probability ``1 - k / E``). Uniform routing spreads tokens the most: a skewed
    router touches fewer distinct experts on average, so this is an upper bound
    on the expected count of a real router.
    """
    require_int(num_experts, "num_experts", 1)
    require_int(experts_per_token, "experts_per_token", 1)
    require_int(tokens, "tokens", 1)
    return num_experts * (1 - (1 - experts_per_token / num_experts) ** tokens)


def decode_bytes_per_gpu(
    cfg: ModelConfig,
    batch: int,
    context_tokens: int,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    tp: int = 1,
) -> int:
    """Bytes one decode step reads on each of ``tp`` GPUs: weights plus ``batch`` caches.

    ``W / tp + B x KV(T) / GPU``: every weight a step multiplies by, once, and each
    sequence's cache once. Tables a token only looks a row up in (an input embedding
    not tied to the LM head, position embeddings) and vision towers are not read
    (:func:`kvlib.weights.params.unread_weight_bytes`). A mixture-of-experts layer reads only
    the experts its ``B`` tokens are routed to: the expected number under uniform
    routing (:func:`expected_experts_touched`) of the ``E`` experts' bytes.
    """
    require_int(batch, "batch", 1)
    weights = weight_bytes(cfg, weight_dtype) - unread_weight_bytes(cfg, weight_dtype)
    if cfg.moe is not None:
        experts = expert_weight_bytes(cfg, weight_dtype)
        moe = cfg.moe
        touched = expected_experts_touched(moe.num_experts, moe.experts_per_token, batch)
        weights = weights - experts + math.ceil(experts * touched / moe.num_experts)
    return cdiv(weights, tp) + batch * kv_bytes_per_gpu(cfg, context_tokens, kv_dtype, tp)


def valid_tp_degrees(cfg: ModelConfig, max_tp: int = 8) -> list[int]:
    """Tensor-parallel degrees up to ``max_tp`` that split the heads evenly.

    vLLM requires ``num_attention_heads % tp == 0``; KV heads are split when
    ``num_key_value_heads % tp == 0`` and replicated when ``tp % num_key_value_heads == 0``.
    """
    require_int(max_tp, "max_tp", 1)
    kv_heads = {layer.kv_heads for layer in cfg.layers if layer.kv_heads is not None}
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
    shares = [layer.tp_share(tp) for layer in cfg.layers]
    return sum(b * s.numerator // s.denominator for b, s in zip(by_layer, shares, strict=True))


def min_gpus(
    cfg: ModelConfig,
    gpu: GPUSpec,
    weight_dtype: str | None = "bf16",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
    max_tp: int = 64,
) -> int | None:
    """Smallest valid tensor-parallel degree whose GPUs hold the weights with room to spare.

    Each GPU gives ``ceil(total x utilization)`` (vLLM's ``gpu_memory_utilization``
    times CUDA's total, :func:`kvlib.hardware.vllm_budget_bytes`); the weights split
    ``1 / tp`` per GPU and something must be left for the KV cache. None if no valid
    degree up to ``max_tp`` fits.
    """
    require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    usable = vllm_budget_bytes(gpu, gpu_memory_utilization)
    weights = weight_bytes(cfg, weight_dtype)
    lower = math.ceil(weights / usable)
    fits = (tp for tp in valid_tp_degrees(cfg, max_tp) if tp >= lower and weights / tp < usable)
    return next(fits, None)


# Prefill: the FLOPs of reading a prompt, and the time to first token they bound.
_MATMUL_ROLES = ("linear", "expert", "router")


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs of one prefill: weight matmuls, the LM head's logits, attention's own products."""

    weights: int  # 2 x active matmul parameters (LM head excluded) x prompt tokens
    lm_head: int  # 2 x LM-head parameters x tokens given logits (1 in a serving engine)
    attention: int  # causal QK^T and AV over the prompt

    @property
    def total(self) -> int:
        """All three terms."""
        return self.weights + self.lm_head + self.attention


def matmul_params(cfg: ModelConfig) -> tuple[int, int]:
    """``(body, lm_head)``: parameters one text token is multiplied through.

    ``body`` is every active linear, expert and router weight (the ``k`` routed
    experts of a MoE layer); ``lm_head`` the output projection (the embedding
    table when tied). Norms, biases (1-D) and the input lookup do no matmul.
    """
    text = [g for g in weight_groups(cfg) if g.part == "text"]
    body = sum(g.active_count for g in text if g.role in _MATMUL_ROLES and len(g.shape) == 2)
    head = sum(g.count for g in text if g.role == "lm_head")
    if cfg.tie_word_embeddings:
        head += (cfg.vocab_size or 0) * cfg.hidden_size
    return body, head


def attention_pairs(spec: CacheSpec, prompt_tokens: int) -> int:
    """(query, key) pairs a causal layer scores over a prompt of ``T`` tokens
    (:meth:`kvlib.specs.CacheSpec.attention_pairs`: ``T (T + 1) / 2`` for full
    attention, ``min(i, W)`` keys a query in a window, its own chunk's in a chunk)."""
    return spec.attention_pairs(prompt_tokens)


def prefill_attention_flops(cfg: ModelConfig, prompt_tokens: int) -> int:
    """``sum over layers of pairs x H x 2 (d_qk + d_v)``: QK^T and AV, 2 FLOPs a multiply-add.

    ``H`` is the query heads (grouped-query attention shares keys, not the work);
    an MLA layer counts its decompressed heads
    (:meth:`kvlib.specs.MLALatent.attention_flops_per_pair`).
    """
    return sum(
        spec.attention_pairs(prompt_tokens)
        * spec.attention_flops_per_pair(cfg.num_attention_heads, cfg.head_dim)
        for spec in cfg.layers
    )


def prefill_flops(cfg: ModelConfig, prompt_tokens: int, *, logits_tokens: int = 1) -> PrefillFlops:
    """FLOPs to prefill ``T`` tokens: ``2 x body x T`` for the weights, ``2 x lm_head x
    logits_tokens`` (engines compute logits for the last prompt token only; a training
    forward does all ``T``), and :func:`prefill_attention_flops`."""
    t = require_int(prompt_tokens, "prompt_tokens", 1)
    require_int(logits_tokens, "logits_tokens", 1)
    if logits_tokens > t:
        raise ValueError(f"logits_tokens ({logits_tokens}) exceeds prompt_tokens ({t})")
    body, head = matmul_params(cfg)
    return PrefillFlops(2 * body * t, 2 * head * logits_tokens, prefill_attention_flops(cfg, t))


def prefill_lower_bound_s(
    cfg: ModelConfig,
    prompt_tokens: int,
    flops_per_s: float,
    bandwidth_bytes_per_s: float,
    *,
    weight_dtype: str | None = "bf16",
    kv_dtype: str = "bf16",
    tp: int = 1,
) -> float:
    """Lower bound on prefill time on each of ``tp`` GPUs: ``max(FLOPs / F, bytes / BW)``.

    FLOPs from :func:`prefill_flops`, split over ``tp``; bytes: the weights the
    prompt's tokens are routed through, read once, and the cache written once.
    Short prompts are bound by the bytes, long ones by the FLOPs. Pass an
    achievable ``flops_per_s`` (a fraction of the datasheet peak).
    """
    require_positive(flops_per_s, "flops_per_s")
    require_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    flops = prefill_flops(cfg, prompt_tokens).total / tp
    moved = decode_bytes_per_gpu(cfg, prompt_tokens, 0, kv_dtype, weight_dtype, tp)
    moved += kv_bytes_per_gpu(cfg, prompt_tokens, kv_dtype, tp)
    return max(flops / flops_per_s, moved / bandwidth_bytes_per_s)


def compute_bound_tokens(
    ridge_flops_per_byte: float, bytes_per_weight: float = 2.0, cfg: ModelConfig | None = None
) -> float:
    """Prompt tokens past which a prefill's weight matmuls are compute-bound.

    A weight of ``b`` bytes does 2 FLOPs per token it multiplies, so ``n`` tokens
    reach the ridge ``R = F / BW`` when ``2 n / b = R``: ``n = R b / 2`` (the
    ridge itself at bf16). Each expert of a MoE layer sees ``k / E`` of the
    tokens (uniform routing), so the prompt must be ``E / k`` times longer.
    """
    require_positive(ridge_flops_per_byte, "ridge_flops_per_byte")
    require_positive(bytes_per_weight, "bytes_per_weight")
    tokens = ridge_flops_per_byte * bytes_per_weight / 2
    if cfg is not None and cfg.moe is not None:
        tokens *= cfg.moe.num_experts / cfg.moe.experts_per_token
    return tokens
