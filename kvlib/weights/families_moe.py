"""Weight tensors of the expert-first families, DeepSeek-V2/V3/V3.2 and gpt-oss, read
off their ``modeling_*.py`` in transformers 5.23 (builders as in :mod:`kvlib.weights.families`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlib.weights.tensors import (
    LAYER,
    LayerTensor,
    LayerTensors,
    fused_experts,
    gated_mlp,
    layer_tensor,
    linear,
    norm,
    outside_tensors,
)

if TYPE_CHECKING:
    from kvlib.config import ModelConfig

__all__ = ["deepseek_tensors", "gpt_oss_tensors"]


# --- DeepSeek-V2/V3/V3.2: MLA projections, dense first layers, shared and routed experts ---


def _mla(cfg: ModelConfig) -> list[LayerTensor]:
    assert cfg.mla is not None
    m, h, heads, p = cfg.mla, cfg.hidden_size, cfg.num_attention_heads, f"{LAYER}.self_attn"
    bias = cfg.layout.attention_bias
    tensors: list[LayerTensor] = []
    if m.q_lora_rank is None:
        tensors += linear(f"{p}.q_proj", heads * m.qk_head_dim, h, False)
    else:
        tensors += linear(f"{p}.q_a_proj", m.q_lora_rank, h, bias)
        tensors += norm(f"{p}.q_a_layernorm", m.q_lora_rank, False)
        tensors += linear(f"{p}.q_b_proj", heads * m.qk_head_dim, m.q_lora_rank, False)
    tensors += linear(f"{p}.kv_a_proj_with_mqa", m.latent_dim, h, bias)
    tensors += norm(f"{p}.kv_a_layernorm", m.kv_lora_rank, False)
    tensors += linear(f"{p}.kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim),
                      m.kv_lora_rank, False)
    return tensors + linear(f"{p}.o_proj", h, heads * m.v_head_dim, bias)


def deepseek_tensors(cfg: ModelConfig) -> LayerTensors:
    """DeepSeek-V2/V3/V3.2: MLA attention; dense MLP layers first, then shared and routed
    experts."""
    h, moe = cfg.hidden_size, cfg.moe

    def layer(i: int) -> list[LayerTensor]:
        tensors = _mla(cfg) + norm(f"{LAYER}.input_layernorm", h, False)
        tensors += norm(f"{LAYER}.post_attention_layernorm", h, False)
        if moe is None or not moe.is_moe_layer(i):
            return tensors + gated_mlp(f"{LAYER}.mlp", h, cfg.intermediate_size, False)
        tensors.append(layer_tensor(f"{LAYER}.mlp.gate.weight", (moe.num_experts, h), "router"))
        tensors += fused_experts(
            f"{LAYER}.mlp.experts", h, moe.expert_width, moe.num_experts, moe.experts_per_token
        )
        if moe.shared_width:
            tensors += gated_mlp(f"{LAYER}.mlp.shared_experts", h, moe.shared_width, False)
        return tensors

    return LayerTensors(outside_tensors(cfg, "model.embed_tokens", "model.norm", False), layer)


# --- gpt-oss: attention with biases and sinks, a biased router, biased fused experts ---


def gpt_oss_tensors(cfg: ModelConfig) -> LayerTensors:
    """gpt-oss: every layer routes to experts whose fused projections carry biases."""
    assert cfg.moe is not None
    h, moe, d = cfg.hidden_size, cfg.moe, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    e, k, width = moe.num_experts, moe.experts_per_token, moe.expert_width
    bias = cfg.layout.attention_bias  # GptOssConfig's default is True

    def layer(i: int) -> list[LayerTensor]:
        attn = f"{LAYER}.self_attn"
        tensors = linear(f"{attn}.q_proj", q, h, bias) + linear(f"{attn}.k_proj", kv, h, bias)
        tensors += linear(f"{attn}.v_proj", kv, h, bias) + linear(f"{attn}.o_proj", h, q, bias)
        tensors.append(layer_tensor(f"{attn}.sinks", (cfg.num_attention_heads,), "other"))
        tensors += [
            layer_tensor(f"{LAYER}.mlp.router.weight", (e, h), "router"),
            layer_tensor(f"{LAYER}.mlp.router.bias", (e,), "router"),
            (f"{LAYER}.mlp.experts.gate_up_proj", (2 * width, h), "expert", e, k),
            (f"{LAYER}.mlp.experts.gate_up_proj_bias", (2 * width,), "bias", e, k),
            (f"{LAYER}.mlp.experts.down_proj", (h, width), "expert", e, k),
            (f"{LAYER}.mlp.experts.down_proj_bias", (h,), "bias", e, k),
        ]
        return (
            tensors
            + norm(f"{LAYER}.input_layernorm", h, False)
            + norm(f"{LAYER}.post_attention_layernorm", h, False)
        )

    return LayerTensors(outside_tensors(cfg, "model.embed_tokens", "model.norm", False), layer)
