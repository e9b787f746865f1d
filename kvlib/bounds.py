"""Deployment arithmetic: tensor parallelism, GPUs needed, and the time bounds of serving.

Cache bytes come from :mod:`kvlib.sizing` and weight bytes from
:mod:`kvlib.weights.params`; this module splits them across ``tp`` GPUs and turns
bytes and FLOPs into seconds with a card's bandwidth and compute
(:mod:`kvlib.hardware`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_fraction, require_int, require_positive
from kvlib.config import ModelConfig
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, GPUSpec, vllm_budget_bytes
from kvlib.sizing import max_context_tokens
from kvlib.specs import CacheSpec
from kvlib.view import expected_experts_touched, model_view
from kvlib.weights.params import weight_bytes

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
    "tp_error",
    "valid_tp_degrees",
    "weight_bytes_per_gpu",
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


def decode_bytes_per_gpu(
    cfg: ModelConfig,
    batch: int,
    context_tokens: int,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    tp: int = 1,
) -> int:
    """Bytes one decode step reads on each of ``tp`` GPUs: weights plus ``batch`` caches.

    The one owner of "bytes a decode step reads": ``W_step / GPU + B x KV(T) / GPU``.
    Every weight a step multiplies by, once, where vLLM places it
    (:func:`weight_bytes_per_gpu`), and each sequence's cache once. Tables a token only
    looks a row up in (an input embedding not tied to the LM head, position embeddings)
    and vision towers are not read (:func:`kvlib.weights.params.unread_weight_bytes`). A
    mixture-of-experts layer reads only the experts its ``B`` tokens are routed to: the
    expected number under uniform routing (:func:`expected_experts_touched`) of the
    ``E`` experts' bytes (:meth:`kvlib.view.ModelView.step_weight_bytes_per_gpu`).
    """
    require_int(batch, "batch", 1)
    weights = model_view(cfg).step_weight_bytes_per_gpu(batch, tp, weight_dtype)
    return weights + batch * kv_bytes_per_gpu(cfg, context_tokens, kv_dtype, tp)


def weight_bytes_per_gpu(cfg: ModelConfig, tp: int = 1, weight_dtype: str | None = "bf16") -> int:
    """Weight bytes on each of ``tp`` tensor-parallel GPUs, as vLLM places them.

    Norms, the MoE router, DeepSeek's MLA down-projections (``fused_qkv_a_proj``) and
    the biases of row-parallel layers are whole on every GPU; the token embedding and
    LM head are padded to 64 rows and split; everything else is split ``tp`` ways
    (:meth:`kvlib.view.ModelView.weight_bytes_per_gpu`, with vLLM's source cited there).
    ``weight_dtype=None`` sizes the checkpoint as shipped.
    """
    return model_view(cfg).weight_bytes_per_gpu(tp, weight_dtype)


def valid_tp_degrees(cfg: ModelConfig, max_tp: int = 8) -> list[int]:
    """Tensor-parallel degrees up to ``max_tp`` that split the heads evenly.

    vLLM requires ``num_attention_heads % tp == 0``; KV heads are split when
    ``num_key_value_heads % tp == 0`` and replicated when ``tp % num_key_value_heads == 0``.
    """
    return model_view(cfg).tp_degrees(max_tp)


def tp_error(cfg: ModelConfig, tp: int) -> str | None:
    """One line saying why ``tp`` cannot serve ``cfg`` and which degrees can, or None."""
    return model_view(cfg).tp_error(tp)


def kv_bytes_per_gpu(
    cfg: ModelConfig, context_tokens: int, kv_dtype: str = "bf16", tp: int = 1
) -> int:
    """Cache bytes one sequence of ``context_tokens`` puts on each of ``tp`` GPUs.

    Standard attention splits the KV heads (``H_kv / tp`` each; one each,
    replicated, once ``tp`` exceeds ``H_kv``); an MLA latent has no heads to
    split and is replicated on every GPU (vLLM's MLA backends).
    """
    error = tp_error(cfg, tp)
    if error:
        raise ValueError(error)
    require_int(context_tokens, "context_tokens")
    # Layers with one spec hold the same bytes: each distinct spec once, times its count
    # (the sum kvlib.sizing.kv_bytes_by_layer spells out layer by layer).
    total = 0
    for spec, count in model_view(cfg).layer_groups:
        share = spec.tp_share(tp)
        total += count * (spec.bytes_for_context(context_tokens, kv_dtype) * share.numerator
                          // share.denominator)
    return total


def min_gpus(
    cfg: ModelConfig,
    gpu: GPUSpec,
    weight_dtype: str | None = "bf16",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
    max_tp: int = 64,
) -> int | None:
    """Smallest valid tensor-parallel degree whose GPUs hold the weights with room to spare.

    Each GPU gives ``ceil(total x utilization)`` (vLLM's ``gpu_memory_utilization``
    times CUDA's total, :func:`kvlib.hardware.vllm_budget_bytes`); each holds its
    :func:`weight_bytes_per_gpu` and something must be left for the KV cache. None if
    no valid degree up to ``max_tp`` fits.
    """
    require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    usable = vllm_budget_bytes(gpu, gpu_memory_utilization)
    fits = (
        tp
        for tp in valid_tp_degrees(cfg, max_tp)
        if weight_bytes_per_gpu(cfg, tp, weight_dtype) < usable
    )
    return next(fits, None)


# Prefill: the FLOPs of reading a prompt, and the time to first token they bound.


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
    table when tied). Norms, biases (1-D) and the input lookup do no matmul, so
    ``body + lm_head`` is :func:`kvlib.weights.params.active_param_count` less them.
    """
    return model_view(cfg).matmul_params


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
        count * spec.attention_pairs(prompt_tokens)
        * spec.attention_flops_per_pair(cfg.num_attention_heads, cfg.head_dim)
        for spec, count in model_view(cfg).layer_groups
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
    # The weights the prompt's T tokens are routed through, once, and the cache written.
    moved = model_view(cfg).step_weight_bytes_per_gpu(prompt_tokens, tp, weight_dtype)
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
