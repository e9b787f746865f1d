"""kvlib.config.guards: encoders, classifiers and encoder-decoders are refused with
the reason, never sized as if they were decoder-only models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvlib.config import ConfigError, load_config
from kvlib.config.guards import nesting_depth

# google-t5/t5-small config.json (the fields that matter here).
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"],
    "model_type": "t5",
    "d_model": 512,
    "d_kv": 64,
    "num_heads": 8,
    "num_layers": 6,
    "is_encoder_decoder": True,
    "vocab_size": 32128,
}
# openai/whisper-small config.json.
WHISPER_SMALL = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "d_model": 768,
    "decoder_attention_heads": 12,
    "decoder_layers": 12,
    "encoder_layers": 12,
    "is_encoder_decoder": True,
}
# google-bert/bert-base-uncased config.json.
BERT_BASE = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "hidden_size": 256}


@pytest.mark.parametrize("config", [T5_SMALL, WHISPER_SMALL], ids=["t5", "whisper"])
def test_encoder_decoders_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"'is_encoder_decoder' is true.*cross-attention"):
        load_config(config)


def test_a_nested_text_config_that_is_an_encoder_decoder_is_refused() -> None:
    with pytest.raises(ConfigError, match="is_encoder_decoder"):
        load_config({"model_type": "wrapper", "text_config": {**LLAMA, "is_encoder_decoder": True}})


@pytest.mark.parametrize(
    "architectures",
    [["BertForMaskedLM"], ["RobertaForSequenceClassification"], ["LlamaForSequenceClassification"],
     ["DebertaV2ForTokenClassification", "DebertaV2ForQuestionAnswering"]],
)
def test_models_that_generate_nothing_are_refused(architectures: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"generates no tokens, so it keeps no KV cache"):
        load_config({**BERT_BASE, "architectures": architectures})


@pytest.mark.parametrize(
    "architectures",
    [None, [], ["LlamaForCausalLM"], ["ChatGLMModel"], ["BertForMaskedLM", "BertLMHeadModel"]],
)
def test_generating_or_unlabelled_models_are_sized(architectures: list[str] | None) -> None:
    config = dict(LLAMA) if architectures is None else {**LLAMA, "architectures": architectures}
    assert load_config(config).num_key_value_heads == 2


def test_the_cli_says_why_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(T5_SMALL))
    result = subprocess.run([sys.executable, "-m", "kvlib", "size", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "decoder-only" in result.stderr


def transformers_default(model_type: str, **small: Any) -> dict[str, Any]:
    """The default config of transformers' class for ``model_type``, as a config.json."""
    from transformers import CONFIG_MAPPING

    fields: dict[str, Any] = CONFIG_MAPPING[model_type](**small).to_dict()
    fields["model_type"] = model_type
    return fields


def test_keys_and_values_of_different_widths_are_refused_outside_mla() -> None:
    """MiMo-V2-Flash caches 192-wide keys and 128-wide values (MiMoV2FlashConfig)."""
    with pytest.raises(ConfigError, match=r"'v_head_dim' \(128\) differs .* 'head_dim' \(192\)"):
        load_config(transformers_default("mimo_v2_flash"))


def test_mla_beside_windowed_layers_is_refused() -> None:
    """dots3's windowed layers keep a cache that is not the MLA latent."""
    with pytest.raises(ConfigError, match="mixes MLA layers with sliding_attention"):
        load_config(transformers_default("dots3_note_text"))


def test_a_derived_indexer_list_must_be_given() -> None:
    """HYV4Config derives which layers share an indexer (no keys cached) when the file
    has no indexer_types; kvlib asks for the list instead of giving every layer keys."""
    fields = transformers_default("hy_v4")
    fields.pop("indexer_types")
    with pytest.raises(ConfigError, match="no 'indexer_types'"):
        load_config(fields)
    given = load_config(transformers_default("hy_v4"))
    shared = transformers_default("hy_v4")["indexer_types"].count("shared")
    assert sum(spec.indexer_head_dim == 0 for spec in given.layers) == shared > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden_size", 10**30), ("hidden_size", 1e300), ("intermediate_size", 2**21),
     ("num_attention_heads", 10**12), ("vocab_size", 2**25)],
)
def test_widths_no_real_model_has_are_refused(field: str, value: float) -> None:
    """A hidden size of 10**30 was sized without a word, its parameter count printing
    float rounding as exact digits; refused like a layer count past MAX_LAYERS."""
    with pytest.raises(ConfigError, match=f"field '{field}' is .*no real model's"):
        load_config({**LLAMA, field: value})


def test_the_largest_published_widths_are_sized() -> None:
    """Llama 3.1 405B: hidden 16,384, MLP 53,248, 128 heads (arXiv:2407.21783, Table 3)."""
    cfg = load_config({**LLAMA, "hidden_size": 16_384, "intermediate_size": 53_248,
                       "num_attention_heads": 128, "num_key_value_heads": 8,
                       "vocab_size": 262_144})
    assert cfg.hidden_size == 16_384 and cfg.intermediate_size == 53_248


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("{}", 1),
        ('{"a": [1, {"b": 2}]}', 3),
        ('{"a": "[[[{{{"}', 1),  # brackets inside a string do not nest
        ('{"a": "\\"[", "b": [[]]}', 3),  # nor after an escaped quote
        ('{"na\u00efve": ["\u00e9"]}', 2),  # non-ASCII text is not a bracket
        ("[" * 1000 + "]" * 1000, 1000),
    ],
)
def test_nesting_depth_counts_open_brackets_outside_strings(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth
