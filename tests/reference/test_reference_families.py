"""kvlib's cache sizes for hybrid and multimodal families against transformers' real caches.

Gemma 4, Gemma 3n, Llama 4, Qwen3-Next, Qwen3.5, DeepSeek-V3.2, Kimi Linear, Phi-3, Phi-2,
gpt-oss and OLMo 3 without ``layer_types``, DBRX and a Gemma 3 vision wrapper each cache
something the plain "K and V of every token" rule misses, or spell it where a generic
reader would not look: full layers of another width (Gemma 4 ``global_head_dim``), layers that
reuse an earlier layer's cache (``num_kv_shared_layers``), attention chunks kept like a
window (Llama 4), fixed convolution and recurrent states (linear attention), MLA latents
plus indexer keys (DeepSeek-V3.2).

Each config below is built with random weights by transformers (no download) and run
over prompts shorter and longer than its window, chunk or convolution kernel, then one
decode step. The bytes every cache layer holds (keys, values, indexer keys, conv and
recurrent states, each tensor counted once) must equal ``kvlib.sizing.kv_bytes`` for the
same dict, layer by layer, in fp32 and bf16. The fields that set the cache (KV heads,
head_dim, latent and indexer widths, linear-attention heads and dims) keep real values
where the model stays cheap; vocabulary, MLP width, experts and query heads are small,
and windows and chunks are shrunk to a few tokens, which kvlib is given identically.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import refmodels
import torch
import transformers
from transformers import AutoConfig
from transformers.cache_utils import Cache

from kvlib import sizing
from kvlib.config import ConfigError, ModelConfig, load_config

pytestmark = pytest.mark.reference

DTYPES = ("fp32", "bf16")
WINDOW = 8  # tokens; every shrunk sliding window and Llama 4 chunk
PROMPTS = (5, 20)  # below and well above WINDOW - 1
# Cache-layer attributes that are bookkeeping, not cached data: DynamicSlidingWindowLayer
# keeps its window as a 0-d long tensor.
BOOKKEEPING = frozenset({"_sliding_window_tensor"})
# Anything else a cache layer holds must be a tensor, a dict or list of them, or one of
# these plain values; another object could hide tensors the walk below would miss.
PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)

# Fields every shrunk model shares: none of them reaches the cache.
_SMALL = {
    "vocab_size": refmodels.SMALL_VOCAB,
    "hidden_size": refmodels.SMALL_HIDDEN,
    "intermediate_size": refmodels.SMALL_MLP,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
_GEMMA4 = {
    **_SMALL,
    "model_type": "gemma4_text",
    "vocab_size_per_layer_input": refmodels.SMALL_VOCAB,
    "hidden_size_per_layer_input": 16,
    "num_hidden_layers": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": WINDOW,
}
_GEMMA3N = {
    **_SMALL,
    "model_type": "gemma3n_text",
    "vocab_size_per_layer_input": refmodels.SMALL_VOCAB,
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 256,  # Gemma 3n E2B/E4B
    "sliding_window": WINDOW,
}
_LLAMA4 = {
    **_SMALL,
    "model_type": "llama4_text",
    "intermediate_size_mlp": refmodels.SMALL_MLP,
    "num_hidden_layers": 8,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,  # Scout and Maverick have 8; head_dim 128 is theirs
    "head_dim": 128,
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
    "attention_chunk_size": WINDOW,
}
_QWEN_MOE = {
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
}
_KIMI = {
    **_SMALL,
    "model_type": "kimi_linear",
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "kv_lora_rank": 512,  # Kimi-Linear-48B-A3B's latent: 512 + 64
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "q_lora_rank": None,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
}

CONFIGS: dict[str, dict[str, Any]] = {
    # Defaults: 5 sliding + 1 full, last layer forced full, full layers 512 wide
    # (global_head_dim absent), K and V both cached.
    "gemma4-defaults": dict(_GEMMA4),
    # attention_k_eq_v: full layers take num_global_key_value_heads (1) and global_head_dim.
    "gemma4-k-eq-v": {
        **_GEMMA4,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "global_head_dim": 64,
    },
    # Without attention_k_eq_v, num_global_key_value_heads is ignored; an explicit
    # layer_types ending in a sliding layer gets its last layer forced full.
    "gemma4-no-k-eq-v-layer-types": {
        **_GEMMA4,
        "attention_k_eq_v": False,
        "num_global_key_value_heads": 1,
        "global_head_dim": 64,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 4,
    },
    # The last 2 layers reuse earlier caches and hold nothing.
    "gemma4-kv-shared": {
        **_GEMMA4,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "global_head_dim": 64,
        "num_kv_shared_layers": 2,
    },
    # Bidirectional attention everywhere halves the window: W // 2 + 1.
    "gemma4-bidirectional-all": {**_GEMMA4, "use_bidirectional_attention": "all"},
    # num_kv_shared_layers absent: Gemma3nTextConfig's default 15 leaves layers 0-4 cached.
    "gemma3n-default-shared": {**_GEMMA3N, "num_hidden_layers": 20},
    "gemma3n-shared-5": {**_GEMMA3N, "num_hidden_layers": 10, "num_kv_shared_layers": 5},
    # no_rope_layers absent: every 4th layer (NoPE) is full, the others chunked.
    "llama4-default-no-rope": dict(_LLAMA4),
    # Scout's config.json ships an empty list, which also means the default.
    "llama4-empty-no-rope": {**_LLAMA4, "no_rope_layers": []},
    "llama4-explicit-no-rope": {**_LLAMA4, "no_rope_layers": [1, 1, 0, 1, 1, 1, 0, 1]},
    # Qwen3-Next-80B-A3B's linear and full attention geometry (4 layers: 3 linear + 1 full).
    "qwen3-next": {
        **_SMALL,
        **_QWEN_MOE,
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
    },
    # Key and value head dims differ, so the recurrent state's shape order shows.
    "qwen3.5-text": {
        **_SMALL,
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 24,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
    },
    # MLA latent 512 + 64 plus 128-wide indexer keys per token (DeepSeek-V3.2's widths).
    "deepseek-v3.2": {
        **_SMALL,
        "model_type": "deepseek_v32",
        "moe_intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "index_n_heads": 2,
        "index_head_dim": 128,
        "index_topk": 8,
    },
    # Default layer types: layers 4, 8, ... (0-based) are full MLA, the rest KDA.
    "kimi-linear-default": {
        **_KIMI,
        "num_hidden_layers": 5,
        "linear_head_dim": 16,
        "linear_num_heads": 3,
        "linear_conv_kernel_dim": 4,
    },
    # Kimi-Linear-48B-A3B's checkpoint form: a nested linear_attn_config whose
    # full_attn_layers are 1-indexed (layers 2 and 4 here are 0-based 1 and 3). Its KDA
    # head_dim (128) and kernel (4) are real; 4 heads instead of 32 keep the reference
    # PyTorch KDA kernel fast (the state is per head, so heads only scale it).
    "kimi-linear-attn-config": {
        **_KIMI,
        "num_hidden_layers": 4,
        "linear_attn_config": {
            "full_attn_layers": [2, 4],
            "kda_layers": [1, 3],
            "head_dim": 128,
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
    },
    # No layer_types: a sliding_window makes every layer slide; MHA (kv heads absent).
    "phi3-sliding": {
        **_SMALL,
        "model_type": "phi3",
        "num_hidden_layers": 3,
        "hidden_size": 96,
        "num_attention_heads": 3,
        "sliding_window": WINDOW,
    },
    # Phi-2: MHA, head_dim = hidden / heads, partial rotary does not narrow the cache.
    "phi-2": {
        **_SMALL,
        "model_type": "phi",
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.4,
    },
    # HY-V4: MLA plus a sparse-attention indexer, which a "shared" layer (indexer_types)
    # borrows from the layer before it and caches no keys for (HYV4Attention.skip_topk).
    "hy-v4-shared-indexer": {
        **_SMALL,
        "model_type": "hy_v4",
        "num_hidden_layers": 3,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "q_lora_rank": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "index_n_heads": 2,
        "index_head_dim": 128,
        "index_topk": 8,
        "layer_types": ["indexed_attention"] * 3,
        "indexer_types": ["full", "full", "shared"],
    },
    # No layer_types: GptOssConfig alternates sliding and full from layer 0 (a guess of
    # "every layer slides when a window is set" would be wrong here).
    "gpt-oss-derived": {
        **_SMALL,
        "model_type": "gpt_oss",
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,  # gpt-oss-20b's
        "sliding_window": WINDOW,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
    },
    # No layer_types: Olmo3Config makes every fourth layer full, the others slide.
    "olmo3-derived": {
        **_SMALL,
        "model_type": "olmo3",
        "num_hidden_layers": 5,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "sliding_window": WINDOW,
    },
    # DBRX spells its KV heads attn_config.kv_n_heads (dbrx-base: 8 of 48 heads, 128 wide);
    # the file has no num_key_value_heads. 12 heads sharing 2 keep its 6:1 ratio.
    "dbrx-attn-config": {
        "model_type": "dbrx",
        "d_model": 12 * 128,
        "n_heads": 12,
        "n_layers": 2,
        "max_seq_len": 64,
        "vocab_size": refmodels.SMALL_VOCAB,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": refmodels.SMALL_MLP, "moe_num_experts": 2,
                       "moe_top_k": 1},
    },
    # google/gemma-3-4b-it's layout: a gemma3 wrapper whose text_config omits the head
    # counts and head_dim (Gemma3TextConfig defaults: 8 heads, 4 KV heads, head_dim 256).
    "gemma3-wrapper": {
        "model_type": "gemma3",
        "mm_tokens_per_image": 4,
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": refmodels.SMALL_HIDDEN,
            "intermediate_size": refmodels.SMALL_MLP,
            "num_hidden_layers": 7,
            "sliding_window": WINDOW,
            "vocab_size": refmodels.SMALL_VOCAB,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "vision_config": refmodels.TINY_VISION_CONFIG,
    },
}

# Prompts per config: below and above the window or chunk (5, 20), at the window edge
# where it matters, and below the convolution kernel (2 < 4) for linear attention.
EXTRA_PROMPTS: Mapping[str, tuple[int, ...]] = {
    "llama4-default-no-rope": (WINDOW - 1, WINDOW),
    "gemma4-bidirectional-all": (WINDOW // 2, WINDOW // 2 + 1),
    "qwen3-next": (2,),
    "qwen3.5-text": (2,),
    "kimi-linear-default": (2,),
    "kimi-linear-attn-config": (2,),
}


@dataclass(frozen=True)
class Step:
    """A prompt of ``prompt_tokens`` then ``decode_tokens`` single-token steps."""

    prompt_tokens: int
    decode_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.decode_tokens

    def __str__(self) -> str:
        return f"T{self.prompt_tokens}+{self.decode_tokens}"


def steps(name: str) -> list[Step]:
    prompts = sorted({*PROMPTS, *EXTRA_PROMPTS.get(name, ())})
    return [Step(t) for t in prompts] + [Step(max(prompts), 1)]


CASES = [
    pytest.param(name, dtype, step, id=f"{name}-{dtype}-{step}")
    for name in CONFIGS
    for dtype in DTYPES
    for step in steps(name)
]


@functools.cache
def built(name: str, dtype: str) -> transformers.PreTrainedModel:
    """The random-weight model for ``CONFIGS[name]``, built once per session."""
    return refmodels.build_model(CONFIGS[name], dtype)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors held directly, or in a dict or list (LinearAttentionLayer's states)."""
    items = value.values() if isinstance(value, Mapping) else value
    for item in items if isinstance(value, Mapping | list | tuple) else [value]:
        assert isinstance(item, (torch.Tensor, *PLAIN)), f"cache holds a {type(item)}"
        if isinstance(item, torch.Tensor):
            yield item


def held_bytes_by_layer(cache: Cache) -> list[int]:
    """``nbytes`` of every tensor each cache layer holds, each tensor counted once.

    Two attributes naming the same tensor, or the same view of one storage, are one
    allocation: they share (pointer, dtype, shape, stride) and are counted once.
    """
    sizes = []
    for layer in cache.layers:
        seen: set[tuple[Any, ...]] = set()
        total = 0
        for name, value in vars(layer).items():
            if name in BOOKKEEPING:
                continue
            for tensor in _tensors(value):
                key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
                if tensor.numel() and key in seen:
                    continue
                seen.add(key)
                total += tensor.nbytes
        sizes.append(total)
    return sizes


def kvlib_config(name: str) -> ModelConfig:
    return load_config(CONFIGS[name])


# The transformers cache-layer class behind each kvlib layer kind.
CACHE_CLASSES: Mapping[str, frozenset[str]] = {
    "full": frozenset({"DynamicLayer"}),
    "mla": frozenset({"DynamicLayer", "DynamicIndexedLayer"}),
    "sliding": frozenset({"DynamicSlidingWindowLayer"}),
    "chunked": frozenset({"DynamicSlidingWindowLayer"}),
    "linear": frozenset({"LinearAttentionLayer"}),
    "shared": frozenset({"DummyLayer"}),
}


@pytest.mark.parametrize(("name", "dtype", "step"), CASES)
def test_kvlib_equals_transformers_cache(name: str, dtype: str, step: Step) -> None:
    cache = refmodels.prefill_and_decode(
        built(name, dtype), step.prompt_tokens, decode_tokens=step.decode_tokens
    )
    cfg = kvlib_config(name)
    classes = [type(layer).__name__ for layer in cache.layers]
    kinds = [layer.kind for layer in cfg.layers]
    assert len(kinds) == len(classes)
    for index, (kind, cls) in enumerate(zip(kinds, classes, strict=True)):
        assert cls in CACHE_CLASSES[kind], f"layer {index}: kvlib {kind!r}, transformers {cls}"
    measured = held_bytes_by_layer(cache)
    expected = sizing.kv_bytes_by_layer(cfg, step.context_tokens, dtype)
    assert expected == measured, f"{name} {dtype} {step}: kvlib per layer vs transformers"
    assert sizing.kv_bytes(cfg, step.context_tokens, dtype) == sum(measured)


def test_layer_kinds_cover_every_family_feature() -> None:
    """The configs above exercise what they claim: shared, chunked, linear and indexed layers."""
    kinds = {name: [layer.kind for layer in kvlib_config(name).layers] for name in CONFIGS}
    assert kinds["gemma4-kv-shared"][-2:] == ["shared", "shared"]
    assert kinds["gemma3n-default-shared"] == ["sliding"] * 4 + ["full"] + ["shared"] * 15
    assert kinds["llama4-default-no-rope"] == (["chunked"] * 3 + ["full"]) * 2
    assert kinds["llama4-explicit-no-rope"][2] == kinds["llama4-explicit-no-rope"][6] == "full"
    assert kinds["kimi-linear-attn-config"] == ["linear", "mla", "linear", "mla"]
    assert kinds["kimi-linear-default"] == ["linear"] * 4 + ["mla"]
    indexed = kvlib_config("deepseek-v3.2").layers
    assert all(layer.kind == "mla" and layer.indexer_head_dim == 128 for layer in indexed)


DEEPSEEK_V4 = {
    "model_type": "deepseek_v4",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "q_lora_rank": 16,
    "index_head_dim": 128,
    "index_n_heads": 2,
    "sliding_window": 128,
    "vocab_size": refmodels.SMALL_VOCAB,
}


def test_deepseek_v4_is_rejected_by_name() -> None:
    """transformers knows the family; kvlib refuses it rather than return a wrong size."""
    fields = {k: v for k, v in DEEPSEEK_V4.items() if k != "model_type"}
    AutoConfig.for_model("deepseek_v4", **fields)  # a real model_type, not a typo
    with pytest.raises(ConfigError, match="deepseek_v4"):
        load_config(DEEPSEEK_V4)
