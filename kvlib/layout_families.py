"""Per-family weight tensors, read off each family's ``modeling_*.py`` in transformers 5.23.

Each builder returns :class:`LayerTensors`: the tensors outside the decoder
layers (embeddings, final norm, LM head) and a function giving layer ``i``'s
tensors. A tensor is ``(module, shape, role)``; a layer tensor also carries
how many copies a layer stores and how many one token uses (experts).
Shapes of linear weights are ``(out_features, in_features)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvlib.config import ModelConfig

__all__ = ["FAMILY_LAYERS", "LayerTensors", "vision_groups"]

RoleName = Literal["linear", "expert", "embedding", "lm_head", "norm", "bias", "router", "other"]
Tensor = tuple[str, tuple[int, ...], RoleName]
LayerTensor = tuple[str, tuple[int, ...], RoleName, int, int | None]

_L = "model.layers.{layer}"


@dataclass(frozen=True)
class LayerTensors:
    """The tensors outside the layers, and those of layer ``i``."""

    outside: list[Tensor]
    per_layer: Callable[[int], list[LayerTensor]]


def _t(module: str, shape: tuple[int, ...], role: RoleName) -> LayerTensor:
    return (module, shape, role, 1, None)


def _linear(module: str, out: int, inp: int, bias: bool) -> list[LayerTensor]:
    """An ``nn.Linear``: weight ``(out, in)`` and, with ``bias``, a bias of ``out``."""
    tensors = [_t(f"{module}.weight", (out, inp), "linear")]
    if bias:
        tensors.append(_t(f"{module}.bias", (out,), "bias"))
    return tensors


def _norm(module: str, size: int, layernorm: bool) -> list[LayerTensor]:
    """RMSNorm (a weight) or LayerNorm (weight and bias)."""
    tensors = [_t(f"{module}.weight", (size,), "norm")]
    if layernorm:
        tensors.append(_t(f"{module}.bias", (size,), "norm"))
    return tensors


def _outside(
    cfg: ModelConfig, embed: str, final_norm: str, layernorm: bool, head_bias: bool = False
) -> list[Tensor]:
    vocab, h = cfg.vocab_size or 0, cfg.hidden_size
    tensors: list[Tensor] = [(f"{embed}.weight", (vocab, h), "embedding")]
    tensors += [(m, s, r) for m, s, r, _, _ in _norm(final_norm, h, layernorm)]
    if not cfg.tie_word_embeddings:
        tensors.append(("lm_head.weight", (vocab, h), "lm_head"))
    if head_bias:
        tensors.append(("lm_head.bias", (vocab,), "bias"))
    return tensors


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
    tensors = _linear(f"{prefix}.q_proj", q, h, qkv_bias)
    tensors += _linear(f"{prefix}.k_proj", kv, h, qkv_bias)
    tensors += _linear(f"{prefix}.v_proj", kv, h, qkv_bias)
    tensors += _linear(f"{prefix}.o_proj", h, q, bias)
    if family in _QK_NORM:
        tensors += _norm(f"{prefix}.q_norm", d, False) + _norm(f"{prefix}.k_norm", d, False)
    return tensors


def _gated_mlp(prefix: str, h: int, width: int, bias: bool) -> list[LayerTensor]:
    return (
        _linear(f"{prefix}.gate_proj", width, h, bias)
        + _linear(f"{prefix}.up_proj", width, h, bias)
        + _linear(f"{prefix}.down_proj", h, width, bias)
    )


def _experts(prefix: str, h: int, width: int, count: int, active: int) -> list[LayerTensor]:
    """Routed experts stored as fused per-layer tensors (gate and up, then down)."""
    return [
        (f"{prefix}.gate_up_proj", (2 * width, h), "expert", count, active),
        (f"{prefix}.down_proj", (h, width), "expert", count, active),
    ]


def _llama_mlp(cfg: ModelConfig, layer: int) -> list[LayerTensor]:
    h, prefix = cfg.hidden_size, f"{_L}.mlp"
    moe = cfg.moe
    if moe is None or not moe.is_moe_layer(layer):
        return _gated_mlp(prefix, h, cfg.intermediate_size, cfg.layout.mlp_bias)
    router: list[LayerTensor] = [_t(f"{prefix}.gate.weight", (moe.num_experts, h), "router")]
    return router + _experts(
        f"{prefix}.experts", h, moe.expert_width, moe.num_experts, moe.experts_per_token
    )


def _llama(cfg: ModelConfig) -> LayerTensors:
    norms = 4 if cfg.model_type in _FOUR_NORMS else 2
    names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm")[:norms]  # fmt: skip

    def layer(i: int) -> list[LayerTensor]:
        tensors = _llama_attention(cfg, f"{_L}.self_attn") + _llama_mlp(cfg, i)
        for name in names:
            tensors += _norm(f"{_L}.{name}", cfg.hidden_size, False)
        return tensors

    return LayerTensors(_outside(cfg, "model.embed_tokens", "model.norm", False), layer)


# --- GPT-2, GPT-NeoX, Phi: LayerNorm with biases and a plain two-matrix MLP ---


def _gpt2(cfg: ModelConfig) -> LayerTensors:
    h, width = cfg.hidden_size, cfg.intermediate_size
    outside = _outside(cfg, "transformer.wte", "transformer.ln_f", True)
    outside.insert(1, ("transformer.wpe.weight", (cfg.layout.learned_positions, h), "embedding"))
    p = "transformer.h.{layer}"

    def layer(i: int) -> list[LayerTensor]:
        return (
            _norm(f"{p}.ln_1", h, True)
            + _linear(f"{p}.attn.c_attn", 3 * h, h, True)
            + _linear(f"{p}.attn.c_proj", h, h, True)
            + _norm(f"{p}.ln_2", h, True)
            + _linear(f"{p}.mlp.c_fc", width, h, True)
            + _linear(f"{p}.mlp.c_proj", h, width, True)
        )

    return LayerTensors(outside, layer)


def _gpt_neox(cfg: ModelConfig) -> LayerTensors:
    h, width, bias = cfg.hidden_size, cfg.intermediate_size, cfg.layout.attention_bias
    outside = _outside(cfg, "gpt_neox.embed_in", "gpt_neox.final_layer_norm", True)
    outside = [("embed_out.weight", s, r) if r == "lm_head" else (m, s, r) for m, s, r in outside]
    p = "gpt_neox.layers.{layer}"

    def layer(i: int) -> list[LayerTensor]:
        return (
            _norm(f"{p}.input_layernorm", h, True)
            + _norm(f"{p}.post_attention_layernorm", h, True)
            + _linear(f"{p}.attention.query_key_value", 3 * h, h, bias)
            + _linear(f"{p}.attention.dense", h, h, bias)
            + _linear(f"{p}.mlp.dense_h_to_4h", width, h, True)
            + _linear(f"{p}.mlp.dense_4h_to_h", h, width, True)
        )

    return LayerTensors(outside, layer)


def _phi(cfg: ModelConfig) -> LayerTensors:
    """Phi-1/1.5/2: one LayerNorm per parallel block; the LM head has a bias."""
    h, width, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    outside = _outside(cfg, "model.embed_tokens", "model.final_layernorm", True, head_bias=True)

    def layer(i: int) -> list[LayerTensor]:
        attn = f"{_L}.self_attn"
        tensors = _norm(f"{_L}.input_layernorm", h, True)
        tensors += _linear(f"{attn}.q_proj", q, h, True) + _linear(f"{attn}.k_proj", kv, h, True)
        tensors += _linear(f"{attn}.v_proj", kv, h, True) + _linear(f"{attn}.dense", h, q, True)
        if cfg.layout.qk_layernorm:
            tensors += _norm(f"{attn}.q_layernorm", d, True) + _norm(f"{attn}.k_layernorm", d, True)
        return (
            tensors
            + _linear(f"{_L}.mlp.fc1", width, h, True)
            + _linear(f"{_L}.mlp.fc2", h, width, True)
        )

    return LayerTensors(outside, layer)


def _falcon(cfg: ModelConfig) -> LayerTensors:
    """Falcon: fused query_key_value; Falcon-7B's parallel block shares one LayerNorm."""
    h, width, bias, d = cfg.hidden_size, cfg.intermediate_size, cfg.layout.bias, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    outside = _outside(cfg, "transformer.word_embeddings", "transformer.ln_f", True)
    p = "transformer.h.{layer}"
    new_arch = cfg.layout.new_decoder_architecture
    if new_arch:
        norms = ["ln_attn", "ln_mlp"]
    else:
        norms = ["input_layernorm"] + (
            [] if cfg.layout.parallel_attn else ["post_attention_layernorm"]
        )

    def layer(i: int) -> list[LayerTensor]:
        tensors = [t for name in norms for t in _norm(f"{p}.{name}", h, True)]
        tensors += _linear(f"{p}.self_attention.query_key_value", qkv, h, bias)
        tensors += _linear(f"{p}.self_attention.dense", h, cfg.num_attention_heads * d, bias)
        return (
            tensors
            + _linear(f"{p}.mlp.dense_h_to_4h", width, h, bias)
            + _linear(f"{p}.mlp.dense_4h_to_h", h, width, bias)
        )

    return LayerTensors(outside, layer)


# --- DeepSeek-V2/V3/V3.2: MLA projections, dense first layers, shared and routed experts ---


def _mla(cfg: ModelConfig) -> list[LayerTensor]:
    assert cfg.mla is not None
    m, h, heads, p = cfg.mla, cfg.hidden_size, cfg.num_attention_heads, f"{_L}.self_attn"
    bias = cfg.layout.attention_bias
    tensors: list[LayerTensor] = []
    if m.q_lora_rank is None:
        tensors += _linear(f"{p}.q_proj", heads * m.qk_head_dim, h, False)
    else:
        tensors += _linear(f"{p}.q_a_proj", m.q_lora_rank, h, bias)
        tensors += _norm(f"{p}.q_a_layernorm", m.q_lora_rank, False)
        tensors += _linear(f"{p}.q_b_proj", heads * m.qk_head_dim, m.q_lora_rank, False)
    tensors += _linear(f"{p}.kv_a_proj_with_mqa", m.latent_dim, h, bias)
    tensors += _norm(f"{p}.kv_a_layernorm", m.kv_lora_rank, False)
    tensors += _linear(f"{p}.kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim),
                       m.kv_lora_rank, False)  # fmt: skip
    return tensors + _linear(f"{p}.o_proj", h, heads * m.v_head_dim, bias)


def _deepseek(cfg: ModelConfig) -> LayerTensors:
    h, moe = cfg.hidden_size, cfg.moe

    def layer(i: int) -> list[LayerTensor]:
        tensors = _mla(cfg) + _norm(f"{_L}.input_layernorm", h, False)
        tensors += _norm(f"{_L}.post_attention_layernorm", h, False)
        if moe is None or not moe.is_moe_layer(i):
            return tensors + _gated_mlp(f"{_L}.mlp", h, cfg.intermediate_size, False)
        tensors.append(_t(f"{_L}.mlp.gate.weight", (moe.num_experts, h), "router"))
        tensors += _experts(
            f"{_L}.mlp.experts", h, moe.expert_width, moe.num_experts, moe.experts_per_token
        )
        if moe.shared_width:
            tensors += _gated_mlp(f"{_L}.mlp.shared_experts", h, moe.shared_width, False)
        return tensors

    return LayerTensors(_outside(cfg, "model.embed_tokens", "model.norm", False), layer)


# --- gpt-oss: attention with biases and sinks, a biased router, biased fused experts ---


def _gpt_oss(cfg: ModelConfig) -> LayerTensors:
    assert cfg.moe is not None
    h, moe, d = cfg.hidden_size, cfg.moe, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    e, k, width = moe.num_experts, moe.experts_per_token, moe.expert_width

    def layer(i: int) -> list[LayerTensor]:
        attn = f"{_L}.self_attn"
        tensors = _linear(f"{attn}.q_proj", q, h, True) + _linear(f"{attn}.k_proj", kv, h, True)
        tensors += _linear(f"{attn}.v_proj", kv, h, True) + _linear(f"{attn}.o_proj", h, q, True)
        tensors.append(_t(f"{attn}.sinks", (cfg.num_attention_heads,), "other"))
        tensors += [
            _t(f"{_L}.mlp.router.weight", (e, h), "router"),
            _t(f"{_L}.mlp.router.bias", (e,), "router"),
            (f"{_L}.mlp.experts.gate_up_proj", (2 * width, h), "expert", e, k),
            (f"{_L}.mlp.experts.gate_up_proj_bias", (2 * width,), "bias", e, k),
            (f"{_L}.mlp.experts.down_proj", (h, width), "expert", e, k),
            (f"{_L}.mlp.experts.down_proj_bias", (h,), "bias", e, k),
        ]
        return (
            tensors
            + _norm(f"{_L}.input_layernorm", h, False)
            + _norm(f"{_L}.post_attention_layernorm", h, False)
        )

    return LayerTensors(_outside(cfg, "model.embed_tokens", "model.norm", False), layer)


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
    },  # fmt: skip
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "phi": _phi,
    "falcon": _falcon,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
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
    tensors: list[Tensor] = [
        (f"{p}.embeddings.patch_embedding.weight", (h, v.num_channels, v.patch_size,
                                                    v.patch_size), "other"),
        (f"{p}.embeddings.patch_embedding.bias", (h,), "bias"),
        (f"{p}.embeddings.position_embedding.weight", (patches, h), "embedding"),
    ]  # fmt: skip
    for i in range(v.num_hidden_layers):
        q = f"{p}.encoder.layers.{i}"
        layer = _norm(f"{q}.layer_norm1", h, True) + _norm(f"{q}.layer_norm2", h, True)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            layer += _linear(f"{q}.self_attn.{name}", h, h, True)
        layer += _linear(f"{q}.mlp.fc1", width, h, True) + _linear(f"{q}.mlp.fc2", h, width, True)
        tensors += [(m, s, r) for m, s, r, _, _ in layer]
    tensors += [(m, s, r) for m, s, r, _, _ in _norm(f"{p}.post_layernorm", h, True)]
    # Gemma3MultiModalProjector: a (vision, text) matrix and an RMSNorm over the vision width.
    tensors.append(("model.multi_modal_projector.mm_input_projection_weight",
                    (h, cfg.hidden_size), "linear"))  # fmt: skip
    tensors.append(("model.multi_modal_projector.mm_soft_emb_norm.weight", (h,), "norm"))
    return tensors
