"""Per-family weight tensors, read off each family's ``modeling_*.py`` in transformers 5.23.

``FAMILY_LAYERS`` maps each ``model_type`` kvlib knows to its builder, which returns
:class:`~kvlib.weights.tensors.LayerTensors`. This module holds the Llama relatives,
the LayerNorm families (GPT-2, GPT-NeoX, Phi, Falcon) and ``vision_groups``, the
vision tower a multimodal checkpoint ships; the expert-first families (DeepSeek,
gpt-oss) are in :mod:`kvlib.weights.families_moe`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvlib.weights.families_moe import deepseek_tensors, gpt_oss_tensors
from kvlib.weights.tensors import (
    LAYER,
    LayerTensor,
    LayerTensors,
    Tensor,
    fused_experts,
    gated_mlp,
    layer_tensor,
    linear,
    norm,
    outside_tensors,
)

if TYPE_CHECKING:
    from kvlib.config import ModelConfig

__all__ = ["FAMILY_LAYERS", "LayerTensors", "vision_groups"]


# --- Llama and its relatives: RMSNorm, q/k/v/o projections, a gated MLP or experts ---

# Families whose q, k, v and o projections take ``attention_bias``; Qwen2's q, k, v
# always carry a bias and o never does; Mistral, Mixtral and Phi-3 have none.
_ATTENTION_BIAS = {"llama", "qwen3", "qwen3_moe", "gemma2", "gemma3_text"}
_QKV_BIAS = {"qwen2"}
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text"}  # RMSNorm over head_dim on q and k
_FOUR_NORMS = {"gemma2", "gemma3_text"}  # pre/post norms around attention and MLP


def _llama_attention(cfg: ModelConfig, prefix: str) -> list[LayerTensor]:
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    family = cfg.model_type
    bias = family in _ATTENTION_BIAS and cfg.layout.attention_bias
    qkv_bias = bias or family in _QKV_BIAS
    tensors = linear(f"{prefix}.q_proj", q, h, qkv_bias)
    tensors += linear(f"{prefix}.k_proj", kv, h, qkv_bias)
    tensors += linear(f"{prefix}.v_proj", kv, h, qkv_bias)
    tensors += linear(f"{prefix}.o_proj", h, q, bias)
    if family in _QK_NORM:
        tensors += norm(f"{prefix}.q_norm", d, False) + norm(f"{prefix}.k_norm", d, False)
    return tensors


def _llama_mlp(cfg: ModelConfig, layer: int) -> list[LayerTensor]:
    h, prefix, moe = cfg.hidden_size, f"{LAYER}.mlp", cfg.moe
    if moe is None or not moe.is_moe_layer(layer):
        return gated_mlp(prefix, h, cfg.intermediate_size, cfg.layout.mlp_bias)
    experts = fused_experts(
        f"{prefix}.experts", h, moe.expert_width, moe.num_experts, moe.experts_per_token
    )
    return [layer_tensor(f"{prefix}.gate.weight", (moe.num_experts, h), "router"), *experts]


def _llama(cfg: ModelConfig) -> LayerTensors:
    norms = 4 if cfg.model_type in _FOUR_NORMS else 2
    names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm")[:norms]

    def layer(i: int) -> list[LayerTensor]:
        tensors = _llama_attention(cfg, f"{LAYER}.self_attn") + _llama_mlp(cfg, i)
        for name in names:
            tensors += norm(f"{LAYER}.{name}", cfg.hidden_size, False)
        return tensors

    return LayerTensors(outside_tensors(cfg, "model.embed_tokens", "model.norm", False), layer)


# --- GPT-2, GPT-NeoX, Phi: LayerNorm with biases and a plain two-matrix MLP ---


def _gpt2(cfg: ModelConfig) -> LayerTensors:
    h, width = cfg.hidden_size, cfg.intermediate_size
    outside = outside_tensors(cfg, "transformer.wte", "transformer.ln_f", True)
    outside.insert(1, ("transformer.wpe.weight", (cfg.layout.learned_positions, h), "embedding"))
    p = "transformer.h.{layer}"

    def layer(i: int) -> list[LayerTensor]:
        return (
            norm(f"{p}.ln_1", h, True)
            + linear(f"{p}.attn.c_attn", 3 * h, h, True)
            + linear(f"{p}.attn.c_proj", h, h, True)
            + norm(f"{p}.ln_2", h, True)
            + linear(f"{p}.mlp.c_fc", width, h, True)
            + linear(f"{p}.mlp.c_proj", h, width, True)
        )

    return LayerTensors(outside, layer)


def _gpt_neox(cfg: ModelConfig) -> LayerTensors:
    h, width, bias = cfg.hidden_size, cfg.intermediate_size, cfg.layout.attention_bias
    outside = outside_tensors(cfg, "gpt_neox.embed_in", "gpt_neox.final_layer_norm", True)
    outside = [("embed_out.weight", s, r) if r == "lm_head" else (m, s, r) for m, s, r in outside]
    p = "gpt_neox.layers.{layer}"

    def layer(i: int) -> list[LayerTensor]:
        return (
            norm(f"{p}.input_layernorm", h, True)
            + norm(f"{p}.post_attention_layernorm", h, True)
            + linear(f"{p}.attention.query_key_value", 3 * h, h, bias)
            + linear(f"{p}.attention.dense", h, h, bias)
            + linear(f"{p}.mlp.dense_h_to_4h", width, h, True)
            + linear(f"{p}.mlp.dense_4h_to_h", h, width, True)
        )

    return LayerTensors(outside, layer)


def _phi(cfg: ModelConfig) -> LayerTensors:
    """Phi-1/1.5/2: one LayerNorm per parallel block; the LM head has a bias."""
    h, width, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    outside = outside_tensors(
        cfg, "model.embed_tokens", "model.final_layernorm", True, head_bias=True
    )

    def layer(i: int) -> list[LayerTensor]:
        attn = f"{LAYER}.self_attn"
        tensors = norm(f"{LAYER}.input_layernorm", h, True)
        tensors += linear(f"{attn}.q_proj", q, h, True) + linear(f"{attn}.k_proj", kv, h, True)
        tensors += linear(f"{attn}.v_proj", kv, h, True) + linear(f"{attn}.dense", h, q, True)
        if cfg.layout.qk_layernorm:
            tensors += norm(f"{attn}.q_layernorm", d, True) + norm(f"{attn}.k_layernorm", d, True)
        return (
            tensors
            + linear(f"{LAYER}.mlp.fc1", width, h, True)
            + linear(f"{LAYER}.mlp.fc2", h, width, True)
        )

    return LayerTensors(outside, layer)


def _falcon(cfg: ModelConfig) -> LayerTensors:
    """Falcon: fused query_key_value; Falcon-7B's parallel block shares one LayerNorm."""
    h, width, bias, d = cfg.hidden_size, cfg.intermediate_size, cfg.layout.bias, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    outside = outside_tensors(cfg, "transformer.word_embeddings", "transformer.ln_f", True)
    p = "transformer.h.{layer}"
    if cfg.layout.new_decoder_architecture:
        norms = ["ln_attn", "ln_mlp"]
    elif cfg.layout.parallel_attn:
        norms = ["input_layernorm"]
    else:
        norms = ["input_layernorm", "post_attention_layernorm"]

    def layer(i: int) -> list[LayerTensor]:
        tensors = [t for name in norms for t in norm(f"{p}.{name}", h, True)]
        tensors += linear(f"{p}.self_attention.query_key_value", qkv, h, bias)
        tensors += linear(f"{p}.self_attention.dense", h, cfg.num_attention_heads * d, bias)
        return (
            tensors
            + linear(f"{p}.mlp.dense_h_to_4h", width, h, bias)
            + linear(f"{p}.mlp.dense_4h_to_h", h, width, bias)
        )

    return LayerTensors(outside, layer)


FAMILY_LAYERS: dict[str, Callable[[ModelConfig], LayerTensors]] = {
    **{
        family: _llama
        for family in (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen3",
            "qwen3_moe",
            "gemma2",
            "gemma3_text",
            "phi3",
        )
    },
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "phi": _phi,
    "falcon": _falcon,
    "deepseek_v2": deepseek_tensors,
    "deepseek_v3": deepseek_tensors,
    "gpt_oss": gpt_oss_tensors,
}


# --- Vision towers shipped by multimodal checkpoints ---


def vision_groups(cfg: ModelConfig) -> list[Tensor] | None:
    """SigLIP (without pooling head) and Gemma 3's projector; None for a tower kvlib
    does not know."""
    v = cfg.vision
    if v is None or v.model_type != "siglip_vision_model" or v.vision_use_head:
        return None
    if cfg.model_type != "gemma3_text":
        return None
    h, width, p = v.hidden_size, v.intermediate_size, "model.vision_tower.vision_model"
    patches = (v.image_size // v.patch_size) ** 2
    patch = (h, v.num_channels, v.patch_size, v.patch_size)
    tensors = [
        layer_tensor(f"{p}.embeddings.patch_embedding.weight", patch, "other"),
        layer_tensor(f"{p}.embeddings.patch_embedding.bias", (h,), "bias"),
        layer_tensor(f"{p}.embeddings.position_embedding.weight", (patches, h), "embedding"),
    ]
    for i in range(v.num_hidden_layers):
        q = f"{p}.encoder.layers.{i}"
        tensors += norm(f"{q}.layer_norm1", h, True) + norm(f"{q}.layer_norm2", h, True)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            tensors += linear(f"{q}.self_attn.{name}", h, h, True)
        tensors += linear(f"{q}.mlp.fc1", width, h, True) + linear(f"{q}.mlp.fc2", h, width, True)
    tensors += norm(f"{p}.post_layernorm", h, True)
    # Gemma3MultiModalProjector: a (vision, text) matrix and an RMSNorm over the vision width.
    projector = "model.multi_modal_projector"
    tensors += [
        layer_tensor(f"{projector}.mm_input_projection_weight", (h, cfg.hidden_size), "linear"),
        layer_tensor(f"{projector}.mm_soft_emb_norm.weight", (h,), "norm"),
    ]
    return [(m, s, r) for m, s, r, _, _ in tensors]
