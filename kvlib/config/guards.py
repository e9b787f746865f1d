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

import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from kvlib._validate import is_int
from kvlib.config.fields import ConfigError, get_bool

__all__ = [
    "MAX_CONFIG_BYTES", "MAX_NESTING", "MAX_WIDTH", "check_generates", "check_modelled",
    "check_sizes", "nesting_depth",
]

# Far above any published decoder: Llama 3.1 405B has a model dimension of 16,384, an MLP
# of 53,248 and 128 query heads ("The Llama 3 Herd of Models", arXiv:2407.21783,
# Table 3). A width past this is a corrupt file, and sized anyway it prints parameter
# counts whose float rounding reads as exact digits.
MAX_WIDTH = 1 << 20
_WIDTH_FIELDS = (
    "hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "ffn_hidden_size",
    "ffn_dim", "moe_intermediate_size", "head_dim", "kv_channels", "kv_lora_rank",
    "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads",
    "num_experts", "n_routed_experts", "num_local_experts",
)
# Vocabularies reach 262,144 (Gemma 3); 2**24 leaves room and still refuses nonsense.
_VOCAB_CAP = 1 << 24
# A config.json is kilobytes; a multi-megabyte one is not a config (or is a weights file
# passed by mistake), and parsing it would be slow before failing.
MAX_CONFIG_BYTES = 16 << 20
# A config.json nests a few levels (the bundled and reference configs: at most 3). The cap
# is checked on the text before parsing, so a deeper file gets the same one line wherever
# it is read: a JSON parser's own limit is its interpreter's recursion depth, which differs
# between CPython and the calculator's Pyodide.
MAX_NESTING = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str) -> int:
    """The deepest run of open ``[`` and ``{`` in JSON ``text``, brackets inside strings
    not counted (a running sum of +1 per opening and -1 per closing bracket)."""
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)

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


def check_sizes(text: Mapping[str, Any]) -> None:
    """Refuse widths, head counts and vocabularies no real model has, before any is
    multiplied into a parameter count or a cache size."""
    # Each cap with the largest real figure it sits far above (bundled configs).
    width = "Llama 3.1 405B's hidden size is 16,384"
    caps = {key: (MAX_WIDTH, width) for key in _WIDTH_FIELDS} | {
        "vocab_size": (_VOCAB_CAP, "Gemma 2's vocabulary is 256,000 tokens")}
    for key, (cap, largest) in caps.items():
        value = text.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # absent, or a type the field's own reader refuses
        if value > cap:  # NaN compares false here and is refused by the typed read
            shown = f"{value:,}" if isinstance(value, int) and value < 10**15 else f"{value:.3g}"
            raise ConfigError(
                f"field {key!r} is {shown}: more than {cap:,} is no real model's ({largest}); "
                "check the config's value"
            )
