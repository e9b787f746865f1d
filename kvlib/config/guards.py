"""Models kvlib refuses to size because they keep no decoder-only KV cache.

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

from kvlib.config.fields import ConfigError, get_bool

__all__ = ["check_generates"]

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
