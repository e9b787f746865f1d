"""How many KV heads a layer keeps, from every spelling kvlib knows, and a refusal
for the spellings it does not.

transformers reads the count from ``num_key_value_heads``; older and remote-code
families spell it otherwise: Falcon's ``num_kv_heads`` and ``n_head_kv``,
``multi_query`` (Falcon-7B, GPTBigCode: one head), ChatGLM's
``multi_query_group_num`` (when ``multi_query_attention``), DBRX's
``attn_config.kv_n_heads`` (``DbrxConfig`` copies it to ``num_key_value_heads``).
A count left in a field none of these names would otherwise be ignored and the
model sized as multi-head attention, 6x too large for DBRX; such a field is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kvlib._validate import is_int
from kvlib.config.fields import ConfigError, first_int, get_bool, get_optional_int

__all__ = ["kv_heads"]

SPELLINGS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
# Sub-configs of other towers or of other settings: their head counts are not the
# language model's KV heads.
_OTHER_TOWERS = re.compile(r"vision|audio|speech|image|video|encoder|quantization|rope")
_LOOKS_LIKE_KV_HEADS = re.compile(r"(kv|key_value).*heads?$|heads?_kv$|query_group")

# Read here, or (Gemma 4's full layers, when attention_k_eq_v) by kvlib.config.layers.
_READ = frozenset(
    {*SPELLINGS, "multi_query_group_num", "attn_config.kv_n_heads", "num_global_key_value_heads"}
)


def kv_heads(text: Mapping[str, Any], num_heads: int) -> int:
    """The KV heads of every layer; a field that looks like another count is refused."""
    count = _read(text, num_heads)
    for path, value in _candidates(text):
        if path not in _READ and value != count:
            raise ConfigError(
                f"field {path!r} ({value}) looks like a KV-head count, which kvlib does not "
                f"read for model_type {text.get('model_type')!r}: it would size {count} KV "
                "heads. Copy the count into 'num_key_value_heads' to size this model"
            )
    return count


def _read(text: Mapping[str, Any], num_heads: int) -> int:
    """``multi_query`` means one head whatever the count fields say, unless Falcon's
    ``new_decoder_architecture``, which reads ``num_kv_heads`` (transformers'
    FalconAttention and vLLM's ``get_total_num_kv_heads`` alike: a Falcon file saved
    by transformers carries ``num_kv_heads`` equal to the query heads beside
    ``multi_query: true``); absent everywhere: multi-head."""
    explicit = first_int(text, SPELLINGS)
    if get_bool(text, "multi_query") and not get_bool(text, "new_decoder_architecture"):
        return 1
    if explicit is not None:
        return explicit
    if get_bool(text, "multi_query_attention"):  # ChatGLM: grouped-query with this many groups
        groups = get_optional_int(text, "multi_query_group_num")
        if groups is None:
            raise ConfigError("'multi_query_attention' is true: add 'multi_query_group_num'")
        return groups
    nested = _attn_config(text, num_heads)
    return nested if nested is not None else num_heads


def _attn_config(text: Mapping[str, Any], num_heads: int) -> int | None:
    """DBRX (``DbrxAttentionConfig.kv_n_heads``, default 1) and MosaicML's MPT
    (``attn_type`` names the kind, ``kv_n_heads`` counts grouped heads)."""
    attn = text.get("attn_config")
    if not isinstance(attn, Mapping):
        return None
    kind = attn.get("attn_type")
    if kind == "multihead_attention":
        return num_heads
    if kind == "multiquery_attention":
        return 1
    count = get_optional_int(attn, "kv_n_heads")
    if count is None and text.get("model_type") == "dbrx":
        return 1  # DbrxAttentionConfig's default
    return count


def _candidates(text: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """Integer fields, top level and one level down, named like a KV-head count."""
    for key, value in text.items():
        if isinstance(value, Mapping) and not _OTHER_TOWERS.search(key):
            for inner, number in value.items():
                if _is_count(inner, number):
                    yield f"{key}.{inner}", number
        elif _is_count(key, value):
            yield key, value


def _is_count(key: object, value: object) -> bool:
    return isinstance(key, str) and is_int(value) and _LOOKS_LIKE_KV_HEADS.search(key) is not None
