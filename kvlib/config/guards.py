"""Models kvlib refuses to size because they keep no decoder-only KV cache, or a
cache whose shape their config.json does not give.

An encoder (BERT) or a classifier reads its input once and generates nothing: it
keeps no KV cache at all. An encoder-decoder (T5, BART, Whisper) keeps two: the
decoder's self-attention cache, one entry per generated token, and a
cross-attention cache over the encoder's whole input. Sized by the decoder-only
rule, the first would get a cache it never allocates and the second half of the
one it does; both are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlib._validate import is_int
from kvlib.config.fields import ConfigError, get_bool

__all__ = ["check_generates", "check_modelled"]

# transformers' task heads that run one forward pass and generate nothing.
NON_GENERATING_HEADS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForNextSentencePrediction",
    "ForImageClassification",
    "ForAudioClassification",
    "ForAudioFrameClassification",
    "ForCTC",
    "ForSemanticSegmentation",
    "ForObjectDetection",
)


def check_generates(data: Mapping[str, Any], text: Mapping[str, Any]) -> None:
    """Refuse an encoder-decoder, and a model whose every architecture is a task head."""
    for source in (data, text):
        if get_bool(source, "is_encoder_decoder"):
            raise ConfigError(
                f"'is_encoder_decoder' is true (model_type {source.get('model_type')!r}): its "
                "decoder caches the generated tokens and, per layer, the encoder's whole input "
                "for cross-attention; kvlib sizes decoder-only models"
            )
    architectures = data.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return
    if all(isinstance(a, str) and a.endswith(NON_GENERATING_HEADS) for a in architectures):
        raise ConfigError(
            f"'architectures' is {architectures}: such a model reads its input in one pass "
            "and generates no tokens, so it keeps no KV cache; kvlib sizes models that "
            "generate (...ForCausalLM, ...ForConditionalGeneration)"
        )


def check_modelled(text: Mapping[str, Any], types: list[str], head_dim: int, mla: bool) -> None:
    """Refuse layouts kvlib's specs do not describe, rather than size them as if they did.

    Keys and values of different widths outside MLA (MiMo-V2-Flash: ``head_dim`` 192,
    ``v_head_dim`` 128), and MLA beside windowed layers (dots3: its windowed layers'
    cache is not an MLA latent, and its width is not in the config).
    """
    v_dim = text.get("v_head_dim")
    if not mla and is_int(v_dim) and v_dim != head_dim:
        raise ConfigError(
            f"'v_head_dim' ({v_dim}) differs from the key width 'head_dim' ({head_dim}) in a "
            f"model without MLA (model_type {text.get('model_type')!r}): kvlib sizes keys and "
            "values of one width, so it would misstate this cache"
        )
    windowed = sorted({t for t in types if t in ("sliding_attention", "chunked_attention")})
    if mla and windowed:
        raise ConfigError(
            f"model_type {text.get('model_type')!r} mixes MLA layers with {', '.join(windowed)} "
            "layers, whose cache shape its config does not give: kvlib does not size it"
        )
