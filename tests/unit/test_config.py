"""kvlib.config: every architecture's fields read the way transformers reads them."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlib import sizing
from kvlib.config import ConfigError, ModelConfig, bundled_models, load_config
from kvlib.weights import params

ROOT = Path(__file__).resolve().parents[2]

LLAMA_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "vocab_size": 128256,
    "intermediate_size": 14336,
}


def test_every_reference_config_is_bundled() -> None:
    assert len(bundled_models()) >= 10
    for name in bundled_models():
        data = json.loads((ROOT / "kvlib/data/configs" / f"{name}.json").read_text())
        assert data["_source"], name


@pytest.mark.parametrize(
    ("name", "kind", "layers", "kv_heads", "head_dim", "sliding"),
    [
        ("Llama-3.1-8B", "GQA", 32, 8, 128, 0),
        ("Llama-3.1-70B", "GQA", 80, 8, 128, 0),
        ("Falcon-7B", "MQA", 32, 1, 64, 0),  # multi_query: one KV head, 4544 / 71 = 64
        ("GPT-2", "MHA", 12, 12, 64, 0),  # n_layer, n_head, n_embd spellings
        ("Gemma-2-9B", "GQA", 42, 8, 256, 21),  # explicit head_dim 256 != 3584 / 16
        ("gpt-oss-20b", "GQA", 24, 8, 64, 12),  # layer_types
        ("Mistral-7B-v0.1", "GQA", 32, 8, 128, 32),  # a window and nothing else: all slide
        ("Mixtral-8x7B", "GQA", 32, 8, 128, 0),  # sliding_window null
        ("Qwen3-8B", "GQA", 36, 8, 128, 0),  # use_sliding_window false
        ("DeepSeek-V3", "MLA", 61, 128, 192, 0),
    ],
)
def test_bundled_shapes(
    name: str, kind: str, layers: int, kv_heads: int, head_dim: int, sliding: int
) -> None:
    cfg = load_config(name)
    assert cfg.attention_type == kind
    assert cfg.num_hidden_layers == layers == len(cfg.layer_kinds)
    assert cfg.num_key_value_heads == kv_heads
    assert cfg.head_dim == head_dim
    assert cfg.num_sliding_layers == sliding


def test_gemma2_alternates_starting_with_a_sliding_layer() -> None:
    kinds = load_config("Gemma-2-9B").layer_kinds
    assert kinds[:4] == ("sliding", "full", "sliding", "full")


def test_mla_is_recognised_from_fields_not_model_type() -> None:
    data = json.loads((ROOT / "kvlib/data/configs/DeepSeek-V3.json").read_text())
    data["model_type"] = "kimi_k2"  # unknown to transformers 5.23
    cfg = load_config(data)
    assert cfg.mla is not None and cfg.mla.latent_dim == 576
    assert set(cfg.layer_kinds) == {"mla"}


def test_nested_text_config_with_transformers_defaults() -> None:
    # google/gemma-3-4b-it's config.json: the text_config omits heads and head_dim,
    # which Gemma3TextConfig fills in (8 heads, 4 KV heads, head_dim 256).
    cfg = load_config(
        {
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 2560,
                "intermediate_size": 10240,
                "num_hidden_layers": 34,
                "sliding_window": 1024,
            },
        }
    )
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 4, 256)
    assert cfg.sliding_window == 1024
    # Five sliding layers, then one full one (sliding_window_pattern 6).
    assert cfg.layer_kinds[:6] == ("sliding",) * 5 + ("full",)
    assert cfg.num_full_layers == 5


def test_qwen2_sliding_layers_start_at_max_window_layers() -> None:
    cfg = load_config(
        {
            **LLAMA_8B,
            "model_type": "qwen2",
            "use_sliding_window": True,
            "sliding_window": 4096,
            "max_window_layers": 28,
        }
    )
    assert cfg.layer_kinds == ("full",) * 28 + ("sliding",) * 4


@pytest.mark.parametrize(
    "off",
    [
        {"sliding_window": None},
        {"sliding_window": 0},
        {"use_sliding_window": False, "sliding_window": 4096},
    ],
)
def test_disabled_window_means_full_attention(off: dict[str, Any]) -> None:
    cfg = load_config({**LLAMA_8B, "model_type": "mistral", **off})
    assert cfg.sliding_window is None and set(cfg.layer_kinds) == {"full"}


def test_missing_kv_heads_default_to_attention_heads() -> None:
    data = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert load_config(data).num_key_value_heads == 32


def test_explicit_head_dim_wins() -> None:
    assert load_config({**LLAMA_8B, "head_dim": 96}).head_dim == 96


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_key_value_heads": 64}, "num_key_value_heads"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"hidden_size": 4000, "num_attention_heads": 48, "num_key_value_heads": 8}, "head_dim"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"layer_types": ["sliding_attention"] * 32}, "sliding_window"),
        ({"layer_types": ["mamba"] * 32}, "layer_types"),
        ({"sliding_window": 4096, "sliding_window_size": 2048}, "sliding_window"),
        ({"text_config": [1, 2]}, "text_config"),
    ],
)
def test_bad_fields_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config({**LLAMA_8B, **change})


def test_missing_required_field() -> None:
    data = {k: v for k, v in LLAMA_8B.items() if k != "num_hidden_layers"}
    data["model_type"] = "not-a-transformers-model"
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_config(data)


def test_load_from_path_and_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    assert load_config(tmp_path).num_key_value_heads == 8
    assert load_config(tmp_path / "config.json").name == tmp_path.name


def test_unreadable_files_give_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(bad)
    with pytest.raises(ConfigError, match="bundled"):
        load_config(tmp_path / "missing.json")


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = list(LLAMA_8B) + [
    "head_dim",
    "sliding_window",
    "layer_types",
    "use_sliding_window",
    "max_window_layers",
    "multi_query",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "text_config",
    "sliding_window_pattern",
    "num_kv_shared_layers",
    "attention_chunk_size",
    "no_rope_layers",
    "linear_attn_config",
    "per_layer_config",
    "global_head_dim",
    "use_bidirectional_attention",
    "full_attention_interval",
    "index_head_dim",
    "linear_num_value_heads",
    "quantization_config",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "mlp_only_layers",
    "decoder_sparse_step",
    "vision_config",
    "tie_word_embeddings",
]
_FAMILIES = [
    "llama",
    "gemma2",
    "gemma3",
    "gemma3n_text",
    "gemma4_text",
    "llama4_text",
    "qwen2",
    "qwen3_next",
    "kimi_linear",
    "deepseek_v32",
    "falcon",
    "gpt2",
    "phi3",
]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(_KEYS), _json_values, max_size=8),
    st.booleans(),
    st.sampled_from(_FAMILIES),
)
def test_malformed_configs_raise_only_config_error(
    changes: dict[str, Any], drop: bool, family: str
) -> None:
    base = {"model_type": family} if drop else {**LLAMA_8B, "model_type": family}
    try:
        cfg = load_config({**base, **changes})
    except ConfigError:
        return
    assert len(cfg.layer_kinds) == cfg.num_hidden_layers
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    # Whatever parsed must size without error, and count its weights or say why not.
    assert sizing.kv_bytes(cfg, 4096) >= 0
    try:
        count = params.count_params(cfg)
    except ConfigError:
        return
    assert (count.total is None) == bool(count.note)
    shipped = params.shipped_weights(cfg)
    assert (shipped.bytes is None) == bool(shipped.note)


@pytest.mark.parametrize(
    ("model", "field"), [("Llama-3.1-8B", "num_hidden_layers"), ("GPT-2", "n_layer")]
)
def test_a_corrupt_layer_count_is_refused_by_name_before_any_per_layer_list(
    model: str, field: str
) -> None:
    config = json.loads((ROOT / "kvlib" / "data" / "configs" / f"{model}.json").read_text())
    assert field in config
    with pytest.raises(ConfigError, match=f"field '{field}' is 11,821,341,256: more than 10,000"):
        load_config({**config, field: 11_821_341_256.0})
    assert len(load_config({**config, field: 10_000}).layer_kinds) == 10_000


def test_one_family_table_for_wrapper_names() -> None:
    """A flat config naming the wrapper family gets the text model's rules and defaults."""
    flat = load_config({"model_type": "gemma3", "hidden_size": 2560, "num_hidden_layers": 12,
                        "sliding_window": 1024})
    nested = load_config({"model_type": "gemma3", "text_config": {
        "hidden_size": 2560, "num_hidden_layers": 12, "sliding_window": 1024}})
    assert flat.model_type == nested.model_type == "gemma3_text"
    assert flat.layers == nested.layers
    assert (flat.num_attention_heads, flat.num_key_value_heads, flat.head_dim) == (8, 4, 256)


def test_moe_is_a_typed_sub_config() -> None:
    deepseek = load_config("DeepSeek-V3")
    assert deepseek.moe is not None
    assert (deepseek.moe.num_experts, deepseek.moe.experts_per_token) == (256, 8)
    assert deepseek.moe.shared_width == 2048  # one shared expert of 2048
    assert [deepseek.moe.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert load_config("Llama-3.1-8B").moe is None
    qwen = load_config({**LLAMA_8B, "model_type": "qwen3_moe", "num_experts": 8,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                        "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert qwen.moe is not None
    assert [qwen.moe.is_moe_layer(i) for i in range(6)] == [False, True, False, False,
                                                             False, True]


def test_quantization_config_is_read() -> None:
    deepseek = load_config("DeepSeek-V3").quantization
    assert deepseek is not None and deepseek.method == "fp8"
    assert deepseek.block_shape == (128, 128)
    oss = load_config("gpt-oss-20b").quantization
    assert oss is not None and oss.method == "mxfp4"
    assert "lm_head" in oss.modules_to_not_convert


@pytest.mark.parametrize(
    ("quantization", "field"),
    [
        ({"bits": 4}, "quant_method"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
        ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
    ],
)
def test_bad_quantization_config_names_the_field(quantization: object, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config({**LLAMA_8B, "quantization_config": quantization})


def test_experts_per_token_must_fit_the_experts() -> None:
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        load_config({**LLAMA_8B, "num_local_experts": 4, "num_experts_per_tok": 8})


def test_vision_tower_is_read() -> None:
    cfg = load_config({"model_type": "gemma3", "text_config": {"hidden_size": 256,
        "num_hidden_layers": 2, "sliding_window": 16},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64,
                          "vision_use_head": False}})
    assert cfg.vision is not None and cfg.vision.model_type == "siglip_vision_model"
    assert not cfg.vision.vision_use_head and load_config("Llama-3.1-8B").vision is None


def test_a_one_token_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="sliding_window"):
        load_config({**LLAMA_8B, "model_type": "mistral", "sliding_window": 1})


def _size_error(path: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "kvlib", "size", str(path)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    return result.stderr


def test_a_config_nested_past_the_readers_depth_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    assert "nests objects or lists more than 64 deep" in _size_error(path)


def test_the_nesting_cap_is_the_same_below_the_readers_depth(tmp_path: Path) -> None:
    """65 levels, far below CPython's recursion limit, are refused as 100,000 are: the
    page's Pyodide and the CLI share the cap, not their parsers' limits."""
    path = tmp_path / "config.json"
    extra = "[" * 64 + "]" * 64  # inside the top-level object: 65 levels in all
    path.write_text(json.dumps(LLAMA_8B)[:-1] + f', "extra": {extra}}}')
    assert "nests objects or lists more than 64 deep" in _size_error(path)
    path.write_text(json.dumps(LLAMA_8B)[:-1] + ', "extra": ' + "[" * 63 + "]" * 63 + "}")
    assert load_config(path).num_hidden_layers == LLAMA_8B["num_hidden_layers"]


def test_a_key_given_twice_is_reported_with_both_values(tmp_path: Path) -> None:
    """A JSON reader keeps the last of two keys silently: 32 layers then 2 would size a
    2-layer model."""
    path = tmp_path / "config.json"
    text = json.dumps(LLAMA_8B)
    path.write_text(text.replace('"num_hidden_layers": 32', '"num_hidden_layers": 32, '
                                 '"num_hidden_layers": 2'))
    assert "key 'num_hidden_layers' is given twice (32, then 2)" in _size_error(path)
    nested = tmp_path / "nested.json"
    nested.write_text('{"text_config": {"head_dim": 64, "head_dim": 128}, "model_type": "x"}')
    with pytest.raises(ConfigError, match="'head_dim' is given twice"):
        load_config(nested)


def test_invalid_utf8_and_oversized_files_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "llama\xff"}')
    assert "not UTF-8 text" in _size_error(path)
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: 100 MB long, nothing written
        f.truncate(100 * 10**6)
    message = _size_error(big)
    assert "100,000,000 bytes" in message and "a config.json is a few kilobytes" in message


_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
           "head_dim", "intermediate_size", "vocab_size", "sliding_window",
           "max_position_embeddings", "model_type", "layer_types", "text_config",
           "torch_dtype", "tie_word_embeddings", "quantization_config", "rope_scaling",
           "kv_lora_rank", "num_experts")
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(_FIELDS), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4),
    depth=st.sampled_from([0, 0, 0, 50, 5_000]),
    duplicate=st.booleans(),
    bad_byte=st.booleans(),
)
def test_fuzzed_configs_are_sized_or_refused_in_one_line(
    changes: dict[str, Any], depth: int, duplicate: bool, bad_byte: bool
) -> None:
    """Whatever the file holds, ``kvlib size`` prints a report or one line naming what is
    wrong: never a traceback (run in-process, so any exception fails the test)."""
    import contextlib
    import io
    import tempfile

    from kvlib.cli import main

    text = json.dumps({**LLAMA_8B, **changes})
    if depth:
        text = text[:-1] + ', "rope_scaling": ' + "[" * depth + "]" * depth + "}"
    if duplicate:
        text = text[:-1] + ', "hidden_size": 4096}'
    data = text.encode()
    if bad_byte:
        data = data[:10] + b"\xc3\x28" + data[10:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["size", str(path), "--gpu", "H100-SXM", "--json"])
    if status == 0:
        assert err.getvalue() == "" and json.loads(out.getvalue())["kv_bytes_per_token"] >= 0
    else:
        assert status == 2 and out.getvalue() == ""
        line = err.getvalue()
        assert line.startswith("kvlib size: error: ") and line.count("\n") == 1


def test_a_configs_hash_is_its_fields_and_is_not_pickled(bundled: ModelConfig) -> None:
    """The hash a config keeps (worked out once for the cached views) is the hash of its
    compared fields; a pickled config carries no hash from this process, and one field
    changed is another config."""
    again = load_config(bundled.name)
    assert again == bundled and hash(again) == hash(bundled)
    compared = [f.name for f in dataclasses.fields(bundled) if f.compare]
    assert hash(bundled) == hash(tuple(getattr(bundled, name) for name in compared))
    copied = pickle.loads(pickle.dumps(bundled))
    assert "_hash" not in copied.__dict__
    assert copied == bundled and hash(copied) == hash(bundled)
    other = dataclasses.replace(bundled, num_hidden_layers=bundled.num_hidden_layers + 1)
    assert other != bundled and {bundled: 1}.get(other) is None
