"""The attention type of every layer, derived the way transformers' config classes derive it.

Names are transformers' ``layer_types`` entries. A config.json may list them;
otherwise each family's config class computes them in ``__post_init__``
(the rules below cite the class), and ``cache_utils.get_layer_types_and_kwargs``
falls back to "sliding if a window is set". Layers that reuse another layer's
cache (``num_kv_shared_layers``) become ``"dummy"``: they store nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvlib.config.fields import ConfigError, derives, family, get_optional_int

__all__ = ["KNOWN_TYPES", "layer_types"]

KNOWN_TYPES = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "indexed_attention",
    "dummy",
)

# Gemma2Config, Gemma3TextConfig, Cohere2Config, Gemma4TextConfig, GptOssConfig,
# VaultGemmaConfig, Olmo3Config, Exaone4Config: layer i slides unless (i + 1) is a
# multiple of the pattern (``sliding_window_pattern`` where the class reads it).
_PATTERNS = {
    "gemma2": 2,
    "gemma3_text": 6,
    "cohere2": 4,
    "gemma4_text": 6,
    "gemma4_unified_text": 6,
    "gpt_oss": 2,
    "vaultgemma": 2,
    "olmo3": 4,
    "exaone4": 4,
}
# Families whose config class derives layer_types by the generic rule of _derive
# (Qwen2Config: the first max_window_layers layers full, the rest sliding when
# use_sliding_window; else every layer slides when a window is set). Any other family
# whose class derives them without a rule here is refused: guessing "every layer
# alike" gave gpt-oss all-sliding and Jamba all-attention.
# tests/reference/test_config_layer_types.py
# checks both sets against the pinned transformers.
_GENERIC = frozenset(
    {
        "ministral",
        "qwen2",
        "qwen2_5_omni_talker",
        "qwen2_5_omni_text",
        "qwen2_5_vl_text",
        "qwen2_moe",
        "qwen2_vl_text",
        "qwen3",
        "smollm3",
    }
)
_UNSUPPORTED = {
    "deepseek_v4": "its compressed sparse attention keeps a cache that is neither per token "
    "nor fixed (token windows compressed 4x and 128x)",
}


def layer_types(text: Mapping[str, Any], num_layers: int, window: int | None) -> list[str]:
    """One transformers layer type per layer, after defaults, forcing and KV sharing."""
    fam = family(text.get("model_type"))
    if fam in _UNSUPPORTED:
        raise ConfigError(f"model_type {fam!r} is not supported by kvlib: {_UNSUPPORTED[fam]}")
    declared = text.get("layer_types")
    if declared is None:
        types = _derive(text, fam, num_layers, window)
    else:
        types = _check(declared, num_layers)
    if fam.startswith("gemma4") and types:
        types[-1] = "full_attention"  # Gemma4TextConfig forces the last layer to full attention
    return _shared(text, types)


def _check(declared: Any, num_layers: int) -> list[str]:
    if not isinstance(declared, list) or len(declared) != num_layers:
        raise ConfigError(
            f"'layer_types' must be a list of {num_layers} entries, one per layer "
            "(e.g. 'full_attention' or 'sliding_attention')"
        )
    for index, name in enumerate(declared):
        if name not in KNOWN_TYPES[:-1]:
            raise ConfigError(
                f"'layer_types'[{index}] is {name!r}: kvlib sizes "
                f"{', '.join(repr(t) for t in KNOWN_TYPES[:-1])} layers"
            )
    return list(declared)


def _derive(text: Mapping[str, Any], fam: str, num_layers: int, window: int | None) -> list[str]:
    rule = _RULES.get(fam)
    if rule is not None:
        return rule(text, num_layers)
    if derives(fam, "layer_types") and fam not in _GENERIC:
        raise ConfigError(
            f"the config has no 'layer_types', and transformers derives them for model_type "
            f"{fam!r} by a rule kvlib does not know (which layers slide, or keep a recurrent "
            "state instead of a KV cache): add the 'layer_types' list, one entry per layer; "
            "transformers prints it with AutoConfig.from_pretrained(PATH)"
            ".get_text_config().layer_types"
        )
    if "use_sliding_window" in text and window is not None:
        # Qwen2Config/Qwen3Config: the first max_window_layers layers keep full attention.
        first = get_optional_int(text, "max_window_layers", minimum=0)
        first = num_layers if first is None else first
        return ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if window is not None:
        return ["sliding_attention"] * num_layers  # Mistral, Phi-3: every layer slides
    if get_optional_int(text, "attention_chunk_size") is not None:
        return ["chunked_attention"] * num_layers
    return ["full_attention"] * num_layers


def _every(num_layers: int, every: int, kind: str) -> list[str]:
    """Layer ``i`` is full attention when ``(i + 1) % every == 0``, else ``kind``."""
    return [kind if (i + 1) % every else "full_attention" for i in range(num_layers)]


def _pattern(text: Mapping[str, Any], num_layers: int) -> list[str]:
    fam = family(text.get("model_type"))
    every = get_optional_int(text, "sliding_window_pattern") or _PATTERNS[fam]
    return _every(num_layers, every, "sliding_attention")


def _llama4(text: Mapping[str, Any], num_layers: int) -> list[str]:
    """Llama4TextConfig: RoPE layers (flag 1) attend in chunks, NoPE layers (0) attend fully."""
    flags = text.get("no_rope_layers") or None  # an empty list means "use the default"
    if flags is None:
        interval = get_optional_int(text, "no_rope_layer_interval") or 4
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if not isinstance(flags, list) or len(flags) != num_layers:
        raise ConfigError(f"'no_rope_layers' must list {num_layers} flags (1 = RoPE, 0 = NoPE)")
    if get_optional_int(text, "attention_chunk_size") is None and any(flags):
        raise ConfigError("'attention_chunk_size' is null: Llama 4 chunked layers need it (8192)")
    return ["chunked_attention" if flag else "full_attention" for flag in flags]


def _qwen3_next(text: Mapping[str, Any], num_layers: int) -> list[str]:
    # Qwen3NextConfig / Qwen3_5TextConfig: one full-attention layer every interval (4).
    every = get_optional_int(text, "full_attention_interval") or 4
    return _every(num_layers, every, "linear_attention")


def _kimi_linear(text: Mapping[str, Any], num_layers: int) -> list[str]:
    """KimiLinearConfig: ``linear_attn_config.full_attn_layers`` is 1-indexed."""
    linear = text.get("linear_attn_config")
    if isinstance(linear, Mapping) and linear.get("full_attn_layers") is not None:
        full = linear["full_attn_layers"]
        if not isinstance(full, list) or not all(isinstance(i, int) for i in full):
            raise ConfigError("'linear_attn_config.full_attn_layers' must list layer numbers")
        return [
            "full_attention" if i + 1 in full else "linear_attention" for i in range(num_layers)
        ]
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(num_layers)]


_RULES: dict[str, Callable[[Mapping[str, Any], int], list[str]]] = {
    **{fam: _pattern for fam in _PATTERNS},
    # Gemma3nTextConfig: every fifth layer is full.
    "gemma3n_text": lambda text, num_layers: _every(num_layers, 5, "sliding_attention"),
    "llama4_text": _llama4,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "kimi_linear": _kimi_linear,
    # DeepseekV32Config: MLA plus indexer keys on every layer.
    "deepseek_v32": lambda text, num_layers: ["indexed_attention"] * num_layers,
}


def _shared(text: Mapping[str, Any], types: list[str]) -> list[str]:
    """The last ``num_kv_shared_layers`` layers reuse earlier caches (Gemma 3n, Gemma 4)."""
    shared = get_optional_int(text, "num_kv_shared_layers", minimum=0)
    if shared is None:
        gemma3n = family(text.get("model_type")) == "gemma3n_text"
        shared = 15 if gemma3n else 0  # Gemma3nTextConfig's default
    if shared > len(types):
        raise ConfigError(
            f"'num_kv_shared_layers' ({shared}) exceeds 'num_hidden_layers' ({len(types)})"
        )
    first = len(types) - shared
    if shared and not set(types[first:]) <= set(types[:first]):
        raise ConfigError(
            "'num_kv_shared_layers' leaves no earlier layer of each shared type to read from: "
            "lower it or change 'layer_types'"
        )
    return types[:first] + ["dummy"] * shared
