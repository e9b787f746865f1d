"""Head counts and the attention kind of every layer, as transformers derives them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvlib._fields import (
    ConfigError,
    first_int,
    get_bool,
    get_optional_int,
    require_first_int,
)

LayerKind = Literal["full", "sliding", "mla", "shared"]
Kind = LayerKind

_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")

_LAYER_TYPE_NAMES: dict[str, Kind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
}

# Families whose config classes fill in a sliding-window pattern when the file
# has none: layer i slides unless (i + 1) is a multiple of the pattern
# (Gemma2Config, Gemma3TextConfig, Cohere2Config in transformers).
_DEFAULT_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}


@dataclass(frozen=True)
class LayerSpec:
    """What one layer caches per token.

    ``kind``: ``"full"`` keeps every token, ``"sliding"`` at most ``window - 1``
    past tokens, ``"mla"`` one latent per token, ``"shared"`` nothing (it reads
    another layer's cache). Heads and head size may differ from layer to layer.
    """

    kind: LayerKind
    num_key_value_heads: int
    head_dim: int
    window: int | None = None


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
    num_heads = require_first_int(text, _HEADS)
    hidden = require_first_int(text, _HIDDEN)
    num_kv_heads = _kv_heads(text, num_heads)
    if num_kv_heads > num_heads or num_heads % num_kv_heads:
        raise ConfigError(
            f"field 'num_key_value_heads' ({num_kv_heads}) must divide "
            f"'num_attention_heads' ({num_heads}): grouped-query attention shares each "
            "KV head among a whole number of query heads"
        )
    return Heads(num_layers, num_heads, num_kv_heads, _head_dim(text, hidden, num_heads), hidden)


def _kv_heads(text: Mapping[str, Any], num_heads: int) -> int:
    """KV heads; ``multi_query`` (Falcon, GPTBigCode) means one shared head.

    Falcon's ``new_decoder_architecture`` ignores ``multi_query`` and reads
    ``num_kv_heads`` instead (FalconAttention in transformers).
    """
    explicit = first_int(text, _KV_HEADS)
    new_arch = get_bool(text, "new_decoder_architecture")
    if get_bool(text, "multi_query") and not new_arch:
        if explicit not in (None, 1):
            raise ConfigError(
                f"'multi_query' is true but 'num_key_value_heads' is {explicit}: "
                "multi-query attention has exactly 1 KV head; drop one of the two fields"
            )
        return 1
    return explicit if explicit is not None else num_heads


def _head_dim(text: Mapping[str, Any], hidden: int, num_heads: int) -> int:
    """An explicit ``head_dim`` wins; otherwise ``hidden_size // num_attention_heads``."""
    explicit = get_optional_int(text, "head_dim")
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
    if chosen and get_bool(text, "use_bidirectional_attention"):
        # Gemma3TextConfig halves a bidirectional window: W // 2 + 1.
        chosen = chosen // 2 + 1
    return chosen or None


def layer_kinds(
    text: Mapping[str, Any], num_layers: int, *, is_mla: bool
) -> tuple[tuple[Kind, ...], int | None]:
    """The attention kind of each layer, and the sliding window if any layer uses it."""
    if is_mla:
        return _same("mla", num_layers), None
    window = sliding_window(text)
    declared = text.get("layer_types")
    if declared is not None:
        kinds = _from_layer_types(declared, num_layers)
    elif window is None:
        kinds = _same("full", num_layers)
    else:
        kinds = _implicit_kinds(text, num_layers)
    if "sliding" not in kinds:
        return kinds, None
    if window is None:
        raise ConfigError(
            "'layer_types' lists sliding_attention layers but 'sliding_window' is null "
            "or disabled: set 'sliding_window' to the window in tokens"
        )
    return kinds, window


def _from_layer_types(declared: Any, num_layers: int) -> tuple[Kind, ...]:
    if not isinstance(declared, list) or len(declared) != num_layers:
        raise ConfigError(
            f"'layer_types' must be a list of {num_layers} entries, one per layer "
            "('full_attention' or 'sliding_attention')"
        )
    kinds: list[Kind] = []
    for index, name in enumerate(declared):
        if name not in _LAYER_TYPE_NAMES:
            raise ConfigError(
                f"'layer_types'[{index}] is {name!r}: kvlib sizes only 'full_attention' "
                "and 'sliding_attention' layers"
            )
        kinds.append(_LAYER_TYPE_NAMES[name])
    return tuple(kinds)


def _implicit_kinds(text: Mapping[str, Any], num_layers: int) -> tuple[Kind, ...]:
    """Which layers slide when the config sets a window but lists no layer types."""
    pattern = get_optional_int(text, "sliding_window_pattern") or _DEFAULT_PATTERNS.get(
        str(text.get("model_type"))
    )
    if pattern is not None:
        return tuple(_kind(bool((i + 1) % pattern)) for i in range(num_layers))
    if "use_sliding_window" in text:
        # Qwen2-style: the first max_window_layers layers keep full attention.
        first_sliding = get_optional_int(text, "max_window_layers", minimum=0)
        first_sliding = num_layers if first_sliding is None else first_sliding
        return tuple(_kind(i >= first_sliding) for i in range(num_layers))
    # Mistral, Phi-3: a window and nothing else means every layer slides.
    return _same("sliding", num_layers)


def _kind(sliding: bool) -> Kind:
    return "sliding" if sliding else "full"


def _same(kind: Kind, num_layers: int) -> tuple[Kind, ...]:
    return tuple(kind for _ in range(num_layers))


def layer_specs(
    text: Mapping[str, Any], kinds: tuple[Kind, ...], window: int | None, heads: Heads
) -> tuple[LayerSpec, ...]:
    """One :class:`LayerSpec` per layer: the shared head shape and each layer's window."""
    return tuple(
        LayerSpec(
            kind=kind,
            num_key_value_heads=heads.num_kv_heads,
            head_dim=heads.head_dim,
            window=window if kind == "sliding" else None,
        )
        for kind in kinds
    )
