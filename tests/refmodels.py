"""Random-weight ``transformers`` models built from real configs, and the bytes their caches hold.

The reference tests size a KV cache with kvlib and compare it with what Hugging Face
``transformers`` really stores. Building a full-size model would take gigabytes, so
:func:`shrink` makes small every field that cannot change the cache (vocabulary, MLP
width, experts, query heads when the KV heads and ``head_dim`` are kept) and the tests
check separately that kvlib gives the shrunk and the real config the same figures.

What ``transformers`` 5.23.0 caches (``cache_utils.py``):

* every decoder here calls ``DynamicCache(config=...)`` when given no past; it gives each
  layer a ``DynamicLayer`` (keeps every token) or, for ``sliding_attention`` layers, a
  ``DynamicSlidingWindowLayer`` that keeps the last ``sliding_window - 1`` tokens;
* keys and values are separate ``[batch, kv_heads, tokens, head_dim]`` tensors;
* DeepSeek's MLA layers store the compressed latent: the "keys" slot holds the
  ``kv_lora_rank``-wide ``kv_nope`` and the "values" slot the ``qk_rope_head_dim``-wide
  rotated key, one head each; ``DeepseekV3Attention.expand_kv`` decompresses them into
  per-head keys and values after the cache is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

# The cache layout for MLA changed between transformers 4 (decompressed K/V) and 5
# (latent); these helpers and their findings hold for this exact release.
TRANSFORMERS_VERSION = "5.23.0"

TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

SMALL_VOCAB = 128
SMALL_HIDDEN = 64
SMALL_MLP = 32

# Not architecture: provenance, packaging and checkpoint metadata. Quantization
# settings describe how weights were stored, not how the cache is laid out.
_METADATA = {
    "architectures",
    "auto_map",
    "dtype",
    "quantization_config",
    "torch_dtype",
    "transformers_version",
}
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")

# Families whose attention honours an explicit ``head_dim`` (checked in their
# configuration_*.py and modeling_*.py): the query heads and hidden size can shrink
# while the cached heads keep their real width.
_EXPLICIT_HEAD_DIM = {
    "gemma2",
    "gemma3_text",
    "gpt_oss",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
}
_MLA = {"deepseek_v2", "deepseek_v3"}


# The smallest SigLIP tower a Gemma 3 wrapper accepts: it does not touch the text cache.
TINY_VISION_CONFIG = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}


def strip_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy without ``_source``-style notes and checkpoint-only fields."""
    return {
        key: value
        for key, value in config.items()
        if not key.startswith("_") and key not in _METADATA
    }


def shrink(config: Mapping[str, Any], *, mla_layout: str = "latent") -> dict[str, Any]:
    """A copy of ``config`` whose cache is the real one, with everything else made small.

    For MLA the two cache layouts need different fields kept: the latent is
    ``kv_lora_rank + qk_rope_head_dim`` wide whatever the head count, while the
    decompressed keys and values depend on the head count and not on the rank.
    """
    small = strip_metadata(config)
    model_type = small.get("model_type")
    small["vocab_size"] = SMALL_VOCAB
    for key in _TOKEN_IDS:
        if key in small:
            small[key] = None  # token ids of the real vocabulary would be out of range
    if model_type in _EXPLICIT_HEAD_DIM:
        _shrink_explicit_head_dim(small)
    elif model_type in _MLA:
        _shrink_mla(small, mla_layout)
    elif model_type == "falcon":
        _shrink_falcon(small)
    elif model_type == "gpt2":
        small["n_inner"] = SMALL_MLP  # heads and width are the cache itself: keep them
    else:
        raise ValueError(f"no shrinking rule for model_type {model_type!r}")
    _shrink_experts(small)
    return small


def _shrink_explicit_head_dim(small: dict[str, Any]) -> None:
    heads = small["num_attention_heads"]
    kv_heads = small.get("num_key_value_heads") or heads
    small["head_dim"] = small.get("head_dim") or small["hidden_size"] // heads
    small["num_key_value_heads"] = kv_heads
    small["num_attention_heads"] = kv_heads  # query heads do not reach the cache
    small["hidden_size"] = SMALL_HIDDEN
    small["intermediate_size"] = SMALL_MLP


def _shrink_mla(small: dict[str, Any], mla_layout: str) -> None:
    small["intermediate_size"] = SMALL_MLP
    if mla_layout == "latent":
        small["hidden_size"] = SMALL_HIDDEN
        small["num_attention_heads"] = 1
        small["num_key_value_heads"] = 1
        lora = 16
    elif mla_layout == "decompressed":
        # Every head is kept, so every per-head projection is narrowed instead.
        small["hidden_size"] = 16
        small["kv_lora_rank"] = 8
        lora = 8
    else:
        raise ValueError(f"mla_layout must be 'latent' or 'decompressed', got {mla_layout!r}")
    if small.get("q_lora_rank") is not None:
        small["q_lora_rank"] = lora


def _shrink_falcon(small: dict[str, Any]) -> None:
    head_dim = small["hidden_size"] // small["num_attention_heads"]
    if small.get("multi_query") and not small.get("new_decoder_architecture"):
        # One shared KV head whatever the query heads; head_dim = hidden / heads.
        small["num_attention_heads"] = 2
        small["hidden_size"] = 2 * head_dim
    small["ffn_hidden_size"] = SMALL_MLP


def _shrink_experts(small: dict[str, Any]) -> None:
    """Fewer experts: each expert is an MLP, none touches attention."""
    if "num_local_experts" in small:
        small["num_local_experts"] = 4
    if "n_routed_experts" in small:
        small["n_routed_experts"] = 4
        small["moe_intermediate_size"] = 16
        small["n_group"] = 1
        small["topk_group"] = 1
    for key in ("num_experts_per_tok", "experts_per_token"):
        if key in small:
            small[key] = 2


def reduce_depth(config: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """A cheaper model for long contexts: ``num_layers`` layers, one query and one KV head.

    The layer pattern is kept (an explicit ``layer_types`` list is cut to its first
    ``num_layers`` entries) and so are ``head_dim`` and the sliding window. This changes
    the cache, so the tests compare it with kvlib on this same reduced config.
    """
    reduced = dict(config)
    reduced["num_hidden_layers"] = num_layers
    if reduced.get("layer_types") is not None:
        reduced["layer_types"] = list(reduced["layer_types"])[:num_layers]
    if reduced.get("model_type") in _EXPLICIT_HEAD_DIM:
        reduced["num_attention_heads"] = 1
        reduced["num_key_value_heads"] = 1
    return reduced


def with_window(config: Mapping[str, Any], window_tokens: int) -> dict[str, Any]:
    """The same config with another sliding window (both spellings of the field)."""
    changed = dict(config)
    changed["sliding_window"] = window_tokens
    if "sliding_window_size" in changed:
        changed["sliding_window_size"] = window_tokens
    return changed


def build_model(config: Mapping[str, Any], dtype: str = "fp32") -> PreTrainedModel:
    """A random-weight causal LM for ``config``, on CPU, with no download."""
    fields = strip_metadata(config)
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=TORCH_DTYPES[dtype])
    return model.eval()


@dataclass(frozen=True)
class CacheBytes:
    """What one cache holds, layer by layer."""

    layer_classes: tuple[str, ...]
    layer_tokens: tuple[int, ...]
    layer_bytes: tuple[int, ...]
    dtypes: frozenset[torch.dtype]

    @property
    def total_bytes(self) -> int:
        """Bytes of every cached key and value tensor."""
        return sum(self.layer_bytes)

    @property
    def sliding(self) -> tuple[bool, ...]:
        """Whether each layer's cache slides (``DynamicSlidingWindowLayer``)."""
        return tuple(name == DynamicSlidingWindowLayer.__name__ for name in self.layer_classes)


def prefill_and_decode(
    model: PreTrainedModel, prompt_tokens: int, *, decode_tokens: int = 0, batch: int = 1
) -> Cache:
    """Run a prompt of ``prompt_tokens`` with ``use_cache=True``, then single-token steps."""
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, prompt_tokens), generator=generator)
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        for _ in range(decode_tokens):
            step = torch.randint(0, vocab, (batch, 1), generator=generator)
            cache = model(step, past_key_values=cache, use_cache=True).past_key_values
    return cache


def cache_bytes(cache: Cache) -> CacheBytes:
    """Sum ``nbytes`` of the key and value tensors of every cache layer.

    ``nbytes`` counts the elements a tensor exposes. A sliding layer's tensors are
    views of the last ``W - 1`` tokens; right after a long prefill the view still
    pins the whole prompt's storage until the next step (a transient that kvlib
    does not model). Any other tensor a layer holds must be scalar bookkeeping,
    so nothing that grows with the context is missed.
    """
    classes, tokens, sizes, dtypes = [], [], [], set()
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer):
            raise TypeError(f"unexpected cache layer {type(layer).__name__}")
        keys, values = layer.keys, layer.values
        if keys.shape[-2] != values.shape[-2]:
            raise AssertionError("keys and values hold different token counts")
        for name, value in vars(layer).items():
            is_other = isinstance(value, torch.Tensor) and name not in ("keys", "values")
            if is_other and value.numel() > 1:
                raise AssertionError(f"layer holds another tensor {name!r} {value.shape}")
        classes.append(type(layer).__name__)
        tokens.append(keys.shape[-2])
        sizes.append(keys.nbytes + values.nbytes)
        dtypes.update((keys.dtype, values.dtype))
    return CacheBytes(tuple(classes), tuple(tokens), tuple(sizes), frozenset(dtypes))


def measure(
    model: PreTrainedModel, prompt_tokens: int, *, decode_tokens: int = 0, batch: int = 1
) -> CacheBytes:
    """Cache bytes after a prompt of ``prompt_tokens`` and ``decode_tokens`` more steps."""
    cache = prefill_and_decode(model, prompt_tokens, decode_tokens=decode_tokens, batch=batch)
    return cache_bytes(cache)


def decompressed_mla_bytes(model: PreTrainedModel, cache: Cache) -> list[int]:
    """Per-layer bytes of the per-head keys and values MLA decompresses from its latent.

    This is what transformers 4.x kept in the cache, and what the attention reads
    after ``expand_kv``: keys ``[B, heads, T, qk_nope + qk_rope]`` and values
    ``[B, heads, T, v_head_dim]``.
    """
    sizes = []
    with torch.no_grad():
        for layer, block in zip(cache.layers, model.model.layers, strict=True):
            keys, values = block.self_attn.expand_kv(layer.keys, layer.values)
            sizes.append(keys.nbytes + values.nbytes)
    return sizes
