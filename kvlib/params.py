"""Parameter counts from a config: what the weights weigh before any byte is downloaded.

Counts follow the module layout of each family in transformers (checked by
building each bundled config on the ``meta`` device and summing
``p.numel()``, see ``tests/test_params.py``). Quantization scales and
zero-points are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvlib._fields import ConfigError, get_bool, get_int, get_optional_int
from kvlib.config import ModelConfig
from kvlib.dtypes import bytes_for

__all__ = ["active_param_count", "param_count", "weight_bytes"]

_LAYERNORM_FAMILIES = {"gpt2", "falcon"}  # LayerNorm has a bias: 2 x hidden per norm
_FOUR_NORM_FAMILIES = {"gemma2", "gemma3", "gemma3_text"}  # pre/post norms around both blocks


@dataclass(frozen=True)
class _Experts:
    """Routed experts of a mixture-of-experts MLP."""

    count: int
    active: int
    width: int
    shared_width: int


def param_count(cfg: ModelConfig) -> int:
    """Total parameters: embeddings, every layer, the final norm and the LM head."""
    return _count(cfg, active_only=False)


def active_param_count(cfg: ModelConfig) -> int:
    """Parameters one token is multiplied through: the FLOP-bearing weights.

    A MoE layer counts only its ``num_experts_per_tok`` routed experts (plus
    shared ones), and the input embedding is left out: it is a table lookup,
    not a matrix product (the LM head is counted, tied or not). Prefill costs
    about ``2 x active_param_count`` FLOPs per prompt token. This is the
    convention of OpenAI's gpt-oss model card (gpt-oss-20b: 3.6B active of
    21B); Mistral's "12.9B active" for Mixtral also counts the embedding table.
    """
    embedding = _vocab(cfg) * cfg.hidden_size
    lookup_only = embedding + _positions(cfg)
    if cfg.tie_word_embeddings:
        lookup_only -= embedding  # the LM head multiplies by it
    return _count(cfg, active_only=True) - lookup_only


def weight_bytes(cfg: ModelConfig, weight_dtype: str = "bf16") -> int:
    """``param_count x bits / 8``: 2 bytes a parameter at bf16, 1 at fp8/int8, 0.5 at int4.

    Quantization scales (a few percent at 4-bit) are not included.
    """
    return bytes_for(param_count(cfg), weight_dtype)


def _count(cfg: ModelConfig, *, active_only: bool) -> int:
    h = cfg.hidden_size
    total = _vocab(cfg) * h + _positions(cfg)  # token (and position) embeddings
    if not cfg.tie_word_embeddings:
        total += _vocab(cfg) * h
    total += _norm(cfg)  # final norm
    for layer in range(cfg.num_hidden_layers):
        total += _attention(cfg) + _mlp(cfg, layer, active_only) + _layer_norms(cfg)
    return total


def _vocab(cfg: ModelConfig) -> int:
    """The vocabulary size, which only the parameter count needs."""
    if cfg.vocab_size is None:
        raise ConfigError(f"{cfg.name}: missing field 'vocab_size', needed to count the weights")
    return cfg.vocab_size


def _positions(cfg: ModelConfig) -> int:
    """GPT-2's learned position embeddings (rotary models have none)."""
    if cfg.model_type != "gpt2":
        return 0
    return get_int(cfg.raw, "n_positions", default=1024) * cfg.hidden_size


def _norm(cfg: ModelConfig) -> int:
    return 2 * cfg.hidden_size if cfg.model_type in _LAYERNORM_FAMILIES else cfg.hidden_size


def _layer_norms(cfg: ModelConfig) -> int:
    if cfg.model_type in _FOUR_NORM_FAMILIES:
        return 4 * _norm(cfg)
    if cfg.model_type == "falcon" and not get_bool(cfg.raw, "new_decoder_architecture"):
        # Falcon-7B's parallel block shares one input LayerNorm.
        parallel = get_bool(cfg.raw, "parallel_attn", default=True)
        return _norm(cfg) if parallel else 2 * _norm(cfg)
    return 2 * _norm(cfg)


def _attention(cfg: ModelConfig) -> int:
    if cfg.mla is not None:
        return _mla_attention(cfg)
    h, d = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    weights = h * (q_out + 2 * kv_out) + q_out * h
    return weights + _attention_extras(cfg, q_out, kv_out)


def _attention_extras(cfg: ModelConfig, q_out: int, kv_out: int) -> int:
    """Biases, per-head norms and sinks, which differ by family."""
    raw, h = cfg.raw, cfg.hidden_size
    family = cfg.model_type
    if family == "gpt2":
        return q_out + 2 * kv_out + h  # c_attn and c_proj biases
    if family == "falcon":
        return q_out + 2 * kv_out + h if get_bool(raw, "bias") else 0
    if family in ("qwen2", "qwen2_moe"):
        return q_out + 2 * kv_out  # q, k, v carry biases; o does not
    extras = q_out + 2 * kv_out + h if get_bool(raw, "attention_bias") else 0
    if family in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        extras += 2 * cfg.head_dim  # q_norm and k_norm (RMSNorm over head_dim)
    if family == "gpt_oss":
        extras += cfg.num_attention_heads  # one learned attention sink per head
    return extras


def _mla_attention(cfg: ModelConfig) -> int:
    """DeepSeek MLA: low-rank query and key/value projections plus their norms."""
    assert cfg.mla is not None
    m, h, heads = cfg.mla, cfg.hidden_size, cfg.num_attention_heads
    if m.q_lora_rank is None:
        query = h * heads * m.qk_head_dim
    else:
        query = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim
    kv = (
        h * m.latent_dim
        + m.kv_lora_rank
        + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    )
    out = heads * m.v_head_dim * h
    bias = 0
    if get_bool(cfg.raw, "attention_bias"):
        bias = (m.q_lora_rank or heads * m.qk_head_dim) + m.latent_dim + h
    return query + kv + out + bias


def _mlp(cfg: ModelConfig, layer: int, active_only: bool) -> int:
    h, width = cfg.hidden_size, cfg.intermediate_size
    family = cfg.model_type
    if family == "gpt2":
        return 2 * h * width + width + h
    if family == "falcon":
        return 2 * h * width + ((width + h) if get_bool(cfg.raw, "bias") else 0)
    experts = _experts(cfg.raw, layer)
    if experts is None:
        return 3 * h * width + ((2 * width + h) if get_bool(cfg.raw, "mlp_bias") else 0)
    used = experts.active if active_only else experts.count
    if family == "gpt_oss":
        # Fused gate_up (2 x width) and down projections, all with biases.
        per_expert = 3 * h * experts.width + 2 * experts.width + h
        return used * per_expert + experts.count * (h + 1)  # router weight and bias
    # DeepSeek's e_score_correction_bias is a buffer in transformers, not a parameter.
    router = experts.count * h
    return used * 3 * h * experts.width + 3 * h * experts.shared_width + router


def _experts(raw: Mapping[str, Any], layer: int) -> _Experts | None:
    """The MoE shape of ``layer``, or None if that layer's MLP is dense."""
    count = None
    for key in ("num_local_experts", "n_routed_experts", "num_experts"):
        count = get_optional_int(raw, key)
        if count is not None:
            break
    if count is None:
        return None
    first_moe = get_optional_int(raw, "first_k_dense_replace", minimum=0) or 0
    every = get_optional_int(raw, "moe_layer_freq") or 1
    if layer < first_moe or layer % every:
        return None
    active = get_optional_int(raw, "num_experts_per_tok") or get_int(raw, "experts_per_token")
    width = get_optional_int(raw, "moe_intermediate_size") or get_int(raw, "intermediate_size")
    shared = (get_optional_int(raw, "n_shared_experts", minimum=0) or 0) * width
    return _Experts(count=count, active=active, width=width, shared_width=shared)
