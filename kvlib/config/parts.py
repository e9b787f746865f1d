"""Typed sub-configs read from ``config.json``: MLA, mixture of experts, the module
layout flags that parameter counts need, multimodal towers and quantization.

Each is a frozen dataclass built by a ``*_from`` function from the text config
(with transformers' defaults filled in); nothing downstream reads raw fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from kvlib._validate import is_int, require_int
from kvlib.config.fields import (
    ConfigError,
    first_int,
    get_bool,
    get_int,
    get_optional_int,
)

__all__ = [
    "IndexerShape",
    "Layout",
    "MLAShape",
    "MoEConfig",
    "QuantizationConfig",
    "VisionTower",
    "indexer_from",
    "layout_from",
    "mla_from",
    "moe_from",
    "quantization_from",
    "vision_from",
]


class _HasAttentionParts(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def mla(self) -> MLAShape | None: ...
    @property
    def indexer(self) -> IndexerShape | None: ...


@dataclass(frozen=True)
class MLAShape:
    """The dimensions of one Multi-head Latent Attention layer (DeepSeek-V2/V3, Kimi K2).

    vLLM, SGLang and transformers 5 cache one latent vector of
    ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer; transformers
    4.x cached the decompressed per-head keys (``qk_nope_head_dim +
    qk_rope_head_dim``) and values (``v_head_dim``) instead, 71x more for DeepSeek-V3.
    """

    hidden_size: int
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):  # every width a positive int
            if f.name == "q_lora_rank" and self.q_lora_rank is None:
                continue  # no query LoRA (DeepSeek-V2-Lite): q_proj directly
            require_int(getattr(self, f.name), f.name, 1)

    @classmethod
    def from_config(cls, cfg: _HasAttentionParts) -> MLAShape:
        """The shape of ``cfg``'s attention layers; ConfigError for a model without MLA."""
        if cfg.mla is None:
            raise ConfigError(
                f"{cfg.name} is not an MLA model: its config has no 'kv_lora_rank' field; give "
                "a DeepSeek-V2/V3-style config (kv_lora_rank, qk_rope_head_dim, ...)"
            )
        return cfg.mla

    @property
    def latent_dim(self) -> int:
        """Elements cached per token per layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """Per-head key width after decompression: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def linear_params(self) -> int:
        """Weights of the projections a token always goes through (not ``kv_b_proj``).

        ``q_a_proj`` and ``q_b_proj`` (or ``q_proj``), ``kv_a_proj_with_mqa``, ``o_proj``
        (transformers ``DeepseekV3Attention``, no biases).
        """
        h, heads = self.hidden_size, self.num_heads
        if self.q_lora_rank is None:
            query = h * heads * self.qk_head_dim
        else:
            query = h * self.q_lora_rank + self.q_lora_rank * heads * self.qk_head_dim
        return query + h * self.latent_dim + heads * self.v_head_dim * h

    @property
    def kv_b_params(self) -> int:
        """``kv_b_proj``: ``W_UK`` and ``W_UV``, ``d_c x H x (d_nope + d_v)``."""
        return self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)

    @property
    def attention_params(self) -> int:
        """Every weight of the layer's attention: projections, ``kv_b_proj`` and the RMSNorms."""
        norms = self.kv_lora_rank + (self.q_lora_rank or 0)
        return self.linear_params + self.kv_b_params + norms


def mla_from(text: Mapping[str, Any], hidden_size: int, num_heads: int) -> MLAShape | None:
    """MLA is recognised from its fields, whatever ``model_type`` says."""
    if text.get("kv_lora_rank") is None:
        return None
    return MLAShape(
        hidden_size=hidden_size,
        num_heads=num_heads,
        kv_lora_rank=get_int(text, "kv_lora_rank"),
        qk_rope_head_dim=get_int(text, "qk_rope_head_dim"),
        qk_nope_head_dim=get_int(text, "qk_nope_head_dim"),
        v_head_dim=get_int(text, "v_head_dim"),
        q_lora_rank=get_optional_int(text, "q_lora_rank"),
    )


@dataclass(frozen=True)
class IndexerShape:
    """DeepSeek Sparse Attention's indexer (DeepSeek-V3.2): ``num_heads`` scoring heads of
    ``head_dim`` (its cached key's width), keeping the ``top_k`` best-scored tokens per
    query (``index_n_heads``, ``index_head_dim``, ``index_topk``: 64, 128, 2048)."""

    num_heads: int
    head_dim: int
    top_k: int

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "top_k"):
            require_int(getattr(self, name), name, 1)

    @classmethod
    def from_config(cls, cfg: _HasAttentionParts) -> IndexerShape:
        """The config's indexer; ConfigError for a model without one."""
        if cfg.indexer is None:
            raise ConfigError(
                f"{cfg.name} has no sparse-attention indexer: a DeepSeek-V3.2 config gives "
                "'index_n_heads', 'index_head_dim' and 'index_topk'"
            )
        return cfg.indexer


def indexer_from(text: Mapping[str, Any]) -> IndexerShape | None:
    """``index_n_heads``, ``index_head_dim``, ``index_topk``; None for a model without one."""
    if text.get("index_head_dim") is None:
        return None
    return IndexerShape(
        num_heads=get_int(text, "index_n_heads"),
        head_dim=get_int(text, "index_head_dim"),
        top_k=get_int(text, "index_topk"),
    )


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts: how many, how many a token uses, their width, which layers."""

    num_experts: int
    experts_per_token: int
    expert_width: int
    shared_width: int
    moe_layers: tuple[bool, ...] = field(repr=False)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) routes its MLP through experts."""
        return self.moe_layers[layer]


_EXPERT_COUNT = ("num_local_experts", "n_routed_experts", "num_experts")
_EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token")


def moe_from(text: Mapping[str, Any], num_layers: int) -> MoEConfig | None:
    """The MoE shape, or None for a dense model.

    Which layers route (DeepseekV3Config: every ``moe_layer_freq``-th layer from
    ``first_k_dense_replace`` on; Qwen2/3-MoE: every ``decoder_sparse_step``-th,
    minus ``mlp_only_layers``; others: every layer).
    """
    counts = (get_optional_int(text, key, minimum=0) for key in _EXPERT_COUNT)
    count = next((c for c in counts if c is not None), None)
    if not count:
        return None
    active = first_int(text, _EXPERTS_PER_TOKEN)
    if active is None or active > count:
        raise ConfigError(
            f"'num_experts_per_tok' must be between 1 and the {count} experts, got {active}"
        )
    width = get_optional_int(text, "moe_intermediate_size") or get_int(text, "intermediate_size")
    shared = (get_optional_int(text, "n_shared_experts", minimum=0) or 0) * width
    shared += get_optional_int(text, "shared_expert_intermediate_size", minimum=0) or 0
    first = get_optional_int(text, "first_k_dense_replace", minimum=0) or 0
    every = get_optional_int(text, "moe_layer_freq") or 1
    step = get_optional_int(text, "decoder_sparse_step") or 1
    dense_only = text.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        raise ConfigError("'mlp_only_layers' must list layer numbers (0-based)")
    moe_layers = tuple(
        i >= first and i % every == 0 and (i + 1) % step == 0 and i not in dense_only
        for i in range(num_layers)
    )
    return MoEConfig(count, active, width, shared, moe_layers)


@dataclass(frozen=True)
class Layout:
    """Module-layout flags that change a parameter count, not the cache."""

    attention_bias: bool  # q, k, v and o projections carry biases
    mlp_bias: bool
    bias: bool  # Falcon's single switch for every linear bias
    parallel_attn: bool  # Falcon-7B: attention and MLP share one input LayerNorm
    new_decoder_architecture: bool  # Falcon-40B and later
    qk_layernorm: bool  # Phi: LayerNorm on queries and keys
    learned_positions: int  # GPT-2's n_positions position-embedding rows


def layout_from(text: Mapping[str, Any]) -> Layout:
    """The flags above, with transformers' defaults where the file omits them."""
    positions = get_optional_int(text, "n_positions") if text.get("model_type") == "gpt2" else 0
    return Layout(
        attention_bias=get_bool(text, "attention_bias"),
        mlp_bias=get_bool(text, "mlp_bias"),
        bias=get_bool(text, "bias"),
        parallel_attn=get_bool(text, "parallel_attn", default=True),
        new_decoder_architecture=get_bool(text, "new_decoder_architecture"),
        qk_layernorm=get_bool(text, "qk_layernorm"),
        learned_positions=positions or 0,
    )


@dataclass(frozen=True)
class VisionTower:
    """A vision encoder a multimodal checkpoint ships beside its language model."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_channels: int
    image_size: int
    patch_size: int
    vision_use_head: bool


def vision_from(data: Mapping[str, Any]) -> VisionTower | None:
    """The ``vision_config`` of a multimodal wrapper, or None for a text-only model."""
    vision = data.get("vision_config")
    if vision is None:
        return None
    if not isinstance(vision, Mapping):
        raise ConfigError("field 'vision_config' must be an object")
    return VisionTower(
        model_type=str(vision.get("model_type", "unknown")),
        hidden_size=get_int(vision, "hidden_size", default=768),
        intermediate_size=get_int(vision, "intermediate_size", default=3072),
        num_hidden_layers=get_int(vision, "num_hidden_layers", default=12),
        num_channels=get_int(vision, "num_channels", default=3),
        image_size=get_int(vision, "image_size", default=224),
        patch_size=get_int(vision, "patch_size", default=16),
        vision_use_head=get_bool(vision, "vision_use_head", default=True),
    )


@dataclass(frozen=True)
class QuantizationConfig:
    """How a checkpoint's weights are stored (``quantization_config``).

    ``method`` is ``quant_method`` (``"fp8"``, ``"mxfp4"``, ``"gptq"``, ``"awq"``,
    ...). ``block_shape`` is fp8's ``weight_block_size`` (one fp32 scale per
    block); ``group_size`` and ``bits`` are those of integer formats;
    ``modules_to_not_convert`` lists module-name patterns kept unquantized.
    """

    method: str
    bits: int | None
    group_size: int | None
    block_shape: tuple[int, int] | None
    modules_to_not_convert: tuple[str, ...]


def quantization_from(data: Mapping[str, Any]) -> QuantizationConfig | None:
    """The checkpoint's ``quantization_config`` (outer or text config), or None."""
    raw = data.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("quant_method"), str):
        raise ConfigError(
            "field 'quantization_config' must be an object with a 'quant_method' string"
        )
    block = raw.get("weight_block_size")
    if block is not None and (
        not isinstance(block, list)
        or len(block) != 2
        or not all(is_int(b) and b > 0 for b in block)
    ):
        raise ConfigError(
            "'quantization_config.weight_block_size' must be two positive integers, e.g. [128, 128]"
        )
    skip = raw.get("modules_to_not_convert") or raw.get("ignored_layers") or []
    if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
        raise ConfigError("'quantization_config.modules_to_not_convert' must list module names")
    return QuantizationConfig(
        method=str(raw["quant_method"]).lower(),
        bits=get_optional_int(raw, "bits"),
        group_size=get_optional_int(raw, "group_size", minimum=-1),
        block_shape=(block[0], block[1]) if block else None,
        modules_to_not_convert=tuple(skip),
    )
