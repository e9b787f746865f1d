"""Head counts and the cache spec of every layer, as transformers derives them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvlib.config.fields import (
    ConfigError,
    derives,
    first_int,
    get_bool,
    get_int,
    get_optional_int,
    require_first_int,
)
from kvlib.config.kv_heads import kv_heads
from kvlib.config.parts import MLAShape
from kvlib.specs import (
    CacheSpec,
    ChunkedLocal,
    FullAttention,
    LinearState,
    MLALatent,
    SharedKV,
    SlidingWindow,
)

__all__ = ["Heads", "attention_heads", "specs_from_types", "sliding_window"]

_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
# Far above any published decoder (Llama 3.1 405B has 126 layers: "The Llama 3 Herd of
# Models", arXiv:2407.21783, Table 3). kvlib builds one spec per layer, so a corrupt count
# must be refused before a list that long is made.
MAX_LAYERS = 10_000


@dataclass(frozen=True)
class Heads:
    """Layer count and attention shape shared by every layer."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int


def attention_heads(text: Mapping[str, Any]) -> Heads:
    """Read layers, query heads, KV heads and head dim; check they agree."""
    num_layers = require_first_int(text, _LAYERS)
    if num_layers > MAX_LAYERS:
        field = next(key for key in _LAYERS if text.get(key) is not None)
        raise ConfigError(f"field {field!r} is {num_layers:,}: more than {MAX_LAYERS:,} layers "
                          "is not a real model; check the config's layer count")
    num_heads = require_first_int(text, _HEADS)
    hidden = require_first_int(text, _HIDDEN)
    num_kv_heads = kv_heads(text, num_heads)
    if num_kv_heads > num_heads or num_heads % num_kv_heads:
        raise ConfigError(
            f"field 'num_key_value_heads' ({num_kv_heads}) must divide "
            f"'num_attention_heads' ({num_heads}): grouped-query attention shares each "
            "KV head among a whole number of query heads"
        )
    return Heads(num_layers, num_heads, num_kv_heads, _head_dim(text, hidden, num_heads), hidden)


def _head_dim(text: Mapping[str, Any], hidden: int, num_heads: int) -> int:
    """An MLA head's query/key width is ``qk_nope + qk_rope``; otherwise an explicit
    ``head_dim`` wins (ChatGLM and Qwen-1 spell it ``kv_channels``), else
    ``hidden_size // num_attention_heads``."""
    if text.get("kv_lora_rank") is not None:
        return get_int(text, "qk_nope_head_dim") + get_int(text, "qk_rope_head_dim")
    explicit = first_int(text, ("head_dim", "kv_channels"))
    if explicit is not None:
        return explicit
    if hidden % num_heads:
        raise ConfigError(
            f"'hidden_size' ({hidden}) is not a multiple of 'num_attention_heads' "
            f"({num_heads}): add an explicit 'head_dim' field"
        )
    return hidden // num_heads


def sliding_window(text: Mapping[str, Any]) -> int | None:
    """The window in tokens, or None when absent, null, 0 or switched off."""
    if text.get("sliding_window") is False or not get_bool(
        text, "use_sliding_window", default=True
    ):
        return None
    window = get_optional_int(text, "sliding_window", minimum=0)
    other = get_optional_int(text, "sliding_window_size", minimum=0)
    if window is not None and other is not None and window != other:
        raise ConfigError(
            f"'sliding_window' ({window}) and 'sliding_window_size' ({other}) disagree: "
            "keep one of them"
        )
    chosen = window if window is not None else other
    if chosen == 1:
        raise ConfigError(
            "'sliding_window' is 1: a window holds the current token and those before it; "
            "set the window in tokens (e.g. 4096), or null for full attention"
        )
    if chosen and text.get("use_bidirectional_attention") in (True, "all"):
        # Gemma3TextConfig and Gemma4TextConfig halve a bidirectional window: W // 2 + 1.
        chosen = chosen // 2 + 1
    return chosen or None


def specs_from_types(
    text: Mapping[str, Any], types: list[str], heads: Heads, mla: MLAShape | None
) -> tuple[CacheSpec, ...]:
    """One cache spec per transformers layer type."""
    window = sliding_window(text)
    overrides = _full_layer_overrides(text, types, heads)
    own_indexer = _own_indexer(text, len(types))
    return tuple(
        _spec(text, layer_type, overrides.get(i, heads), own_indexer[i], window, mla)
        for i, layer_type in enumerate(types)
    )


def _own_indexer(text: Mapping[str, Any], num_layers: int) -> list[bool]:
    """Whether each layer runs (and caches keys for) its own sparse-attention indexer:
    ``indexer_types[i]`` "shared" reuses an earlier layer's top-k and caches none
    (HYV4Attention's ``skip_topk``); absent, every indexed layer has its own."""
    kinds = text.get("indexer_types")
    if kinds is None:
        if derives(str(text.get("model_type", "")), "indexer_types"):
            raise ConfigError(
                "the config has no 'indexer_types', and transformers derives them for "
                f"model_type {text.get('model_type')!r} (which layers cache their own indexer "
                "keys): add the list, one 'full' or 'shared' per layer"
            )
        return [True] * num_layers
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise ConfigError(f"'indexer_types' must list {num_layers} entries ('full' or 'shared')")
    unknown = sorted({str(k) for k in kinds} - {"full", "shared"})
    if unknown:
        raise ConfigError(f"'indexer_types' entries must be 'full' or 'shared', got {unknown}")
    return [kind == "full" for kind in kinds]


def _spec(
    text: Mapping[str, Any],
    layer_type: str,
    heads: Heads,
    own_indexer: bool,
    window: int | None,
    mla: MLAShape | None,
) -> CacheSpec:
    if layer_type == "dummy":
        return SharedKV()
    if layer_type == "linear_attention":
        return _linear(text)
    if layer_type == "sliding_attention":
        if window is None:
            raise ConfigError(
                "'layer_types' lists sliding_attention layers but 'sliding_window' is null "
                "or disabled: set 'sliding_window' to the window in tokens"
            )
        return SlidingWindow(heads.num_kv_heads, heads.head_dim, window)
    if layer_type == "chunked_attention":
        chunk = get_optional_int(text, "attention_chunk_size", minimum=2)
        if chunk is None:
            raise ConfigError("chunked_attention layers need 'attention_chunk_size' (tokens)")
        return ChunkedLocal(heads.num_kv_heads, heads.head_dim, chunk)
    indexed = layer_type == "indexed_attention" and own_indexer
    indexer = get_int(text, "index_head_dim") if indexed else 0
    if mla is not None:
        return MLALatent(mla, indexer_head_dim=indexer)
    if indexer:
        raise ConfigError(
            "indexed_attention layers need the MLA fields 'kv_lora_rank' and 'qk_rope_head_dim'"
        )
    return FullAttention(heads.num_kv_heads, heads.head_dim)


def _full_layer_overrides(
    text: Mapping[str, Any], types: list[str], heads: Heads
) -> dict[int, Heads]:
    """Per-layer heads of Gemma 4's full-attention layers, where they differ.

    Gemma4TextConfig gives them ``global_head_dim`` (512 when absent) and,
    only when ``attention_k_eq_v`` is true, ``num_global_key_value_heads``;
    a ``per_layer_config`` in the file overrides both.
    """
    explicit = text.get("per_layer_config")
    if isinstance(explicit, Mapping):
        return {
            int(index): replace(
                heads,
                num_kv_heads=get_int(fields, "num_key_value_heads", default=heads.num_kv_heads),
                head_dim=get_int(fields, "head_dim", default=heads.head_dim),
            )
            for index, fields in explicit.items()
            if isinstance(fields, Mapping) and str(index).isdecimal() and str(index).isascii()
        }
    if not str(text.get("model_type", "")).startswith("gemma4"):
        return {}
    head_dim = get_optional_int(text, "global_head_dim") or 512
    kv_heads = heads.num_kv_heads
    if get_bool(text, "attention_k_eq_v"):
        kv_heads = get_optional_int(text, "num_global_key_value_heads") or kv_heads
    full = replace(heads, num_kv_heads=kv_heads, head_dim=head_dim)
    return {i: full for i, t in enumerate(types) if t == "full_attention"}


_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_heads", "linear_head_dim")


def _linear(text: Mapping[str, Any]) -> LinearState:
    """Fixed state of a linear-attention layer: a short convolution and a recurrent matrix.

    Qwen3-Next/Qwen3.5 Gated DeltaNet: conv ``(2 Hk dk + Hv dv) x K``, recurrent
    ``Hv x dk x dv``; Kimi Linear KDA: conv ``3 H d x K``, recurrent ``H x d x d``.
    transformers keeps the recurrent state in fp32 whatever the model dtype.
    """
    nested = text.get("linear_attn_config")
    if isinstance(nested, Mapping):  # Kimi Linear checkpoints
        num_heads = get_int(nested, "num_heads", default=32)
        dim = get_int(nested, "head_dim", default=128)
        kernel = get_int(nested, "short_conv_kernel_size", default=4)
    elif not any(key in text for key in _LINEAR_FIELDS):
        raise ConfigError(
            f"'layer_types' lists linear_attention layers, but model_type "
            f"{text.get('model_type')!r} has none of the fields kvlib sizes such a state from "
            f"({', '.join(_LINEAR_FIELDS)}, or Kimi's 'linear_attn_config'): a Mamba or "
            "lightning-attention state is not modelled"
        )
    elif "linear_num_heads" in text or "linear_head_dim" in text:
        num_heads = get_int(text, "linear_num_heads")
        dim = get_int(text, "linear_head_dim")
        kernel = get_int(text, "linear_conv_kernel_dim")
    else:  # Gated DeltaNet
        key_heads = get_int(text, "linear_num_key_heads")
        key_dim = get_int(text, "linear_key_head_dim")
        value_heads = get_int(text, "linear_num_value_heads")
        value_dim = get_int(text, "linear_value_head_dim")
        kernel = get_int(text, "linear_conv_kernel_dim")
        conv = (2 * key_heads * key_dim + value_heads * value_dim) * kernel
        return LinearState(conv, value_heads * key_dim * value_dim)
    return LinearState(3 * num_heads * dim * kernel, num_heads * dim * dim)
