"""kvlib.config.kv_heads: every spelling of the KV-head count kvlib reads, and a
refusal for a count left in a field it does not read.

The configs are the published ones (fields that set the cache copied from each
repository's config.json); the expected bytes are written out from the shapes
their model code allocates. DBRX is also checked byte for byte against
transformers' cache in tests/reference/test_reference_families.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvlib import sizing
from kvlib.config import ConfigError, load_config

# databricks/dbrx-base config.json: 48 query heads share 8 KV heads (attn_config).
DBRX = {
    "architectures": ["DbrxForCausalLM"],
    "model_type": "dbrx",
    "d_model": 6144,
    "n_heads": 48,
    "n_layers": 40,
    "max_seq_len": 32768,
    "vocab_size": 100352,
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
    "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
}
# THUDM/chatglm3-6b config.json: multi_query_group_num KV groups of kv_channels each
# (ChatGLM's SelfAttention allocates 2 x groups x kv_channels per token per layer).
CHATGLM3 = {
    "architectures": ["ChatGLMModel"],
    "model_type": "chatglm",
    "num_layers": 28,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "kv_channels": 128,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "seq_length": 8192,
    "padded_vocab_size": 65024,
    "ffn_hidden_size": 13696,
}
# mosaicml/mpt-7b config.json: attn_type names multi-head attention.
MPT_7B = {
    "architectures": ["MPTForCausalLM"],
    "model_type": "mpt",
    "d_model": 4096,
    "n_heads": 32,
    "n_layers": 32,
    "max_seq_len": 2048,
    "vocab_size": 50432,
    "attn_config": {"alibi": True, "attn_type": "multihead_attention", "qk_ln": False},
}


def bf16_bytes_per_token(config: dict[str, Any]) -> int:
    return sizing.kv_bytes_per_token(load_config(config), "bf16")


def test_dbrx_reads_attn_config() -> None:
    cfg = load_config(DBRX)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.attention_type) == (8, 128, "GQA")
    assert bf16_bytes_per_token(DBRX) == 2 * 40 * 8 * 128 * 2  # 160 KiB, not 960 KiB


def test_dbrx_without_kv_n_heads_takes_its_class_default() -> None:
    """DbrxAttentionConfig's kv_n_heads defaults to 1."""
    config = {**DBRX, "attn_config": {"clip_qkv": 8}}
    assert load_config(config).num_key_value_heads == 1


def test_chatglm_reads_its_groups_and_kv_channels() -> None:
    cfg = load_config(CHATGLM3)
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == (28, 2, 128)
    assert bf16_bytes_per_token(CHATGLM3) == 28 * 2 * 2 * 128 * 2  # 28 KiB
    multi_head = {**CHATGLM3, "multi_query_attention": False}
    assert load_config(multi_head).num_key_value_heads == 32


@pytest.mark.parametrize(
    ("attn_type", "kv_n_heads", "expected"),
    [
        ("multihead_attention", 8, 32),  # kv_n_heads is ignored for multi-head attention
        ("multiquery_attention", None, 1),
        ("grouped_query_attention", 8, 8),
    ],
)
def test_mpt_follows_attn_type(attn_type: str, kv_n_heads: int | None, expected: int) -> None:
    attn: dict[str, Any] = {"attn_type": attn_type}
    if kv_n_heads is not None:
        attn["kv_n_heads"] = kv_n_heads
    assert load_config({**MPT_7B, "attn_config": attn}).num_key_value_heads == expected


def test_mpt_7b_is_multi_head() -> None:
    assert bf16_bytes_per_token(MPT_7B) == 2 * 32 * 32 * 128 * 2


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"n_kv_heads": 8}, "n_kv_heads"),  # Meta's params.json spelling
        ({"attention": {"num_kv_heads": 4}}, "attention.num_kv_heads"),
        ({"num_query_groups": 8}, "num_query_groups"),  # Megatron's spelling
    ],
)
def test_an_unread_count_is_refused_naming_the_field(extra: dict[str, Any], field: str) -> None:
    config = {"model_type": "custom", "num_hidden_layers": 32, "num_attention_heads": 32,
              "hidden_size": 4096, **extra}
    with pytest.raises(ConfigError, match=rf"field '{field}' \(\d+\).*'num_key_value_heads'"):
        load_config(config)


def test_a_count_that_agrees_or_belongs_to_another_tower_is_not_refused() -> None:
    config = {"model_type": "custom", "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 2, "hidden_size": 512, "n_kv_heads": 2,
              "vision_config": {"num_key_value_heads": 16}}
    assert load_config(config).num_key_value_heads == 2


@pytest.mark.parametrize("saved_count", [None, 1, 71])
def test_multi_query_means_one_head_whatever_the_count_says(saved_count: int | None) -> None:
    """tiiuae/falcon-7b: ``multi_query: true``. A copy saved by transformers also carries
    ``num_kv_heads: 71`` (FalconConfig's default, the query heads), which FalconAttention
    and vLLM's ``get_total_num_kv_heads`` both ignore: one KV head."""
    falcon_7b = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                 "num_hidden_layers": 32, "multi_query": True}
    if saved_count is not None:
        falcon_7b["num_kv_heads"] = saved_count
    assert load_config(falcon_7b).num_key_value_heads == 1
    new_architecture = {**falcon_7b, "new_decoder_architecture": True, "num_kv_heads": 8,
                        "num_attention_heads": 128, "hidden_size": 8192}
    assert load_config(new_architecture).num_key_value_heads == 8


def test_multi_query_agrees_with_transformers_falcon_attention() -> None:
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconAttention

    hf = FalconConfig(hidden_size=64, num_attention_heads=4, num_kv_heads=4, multi_query=True,
                      num_hidden_layers=1, vocab_size=16)
    expected = FalconAttention(hf).num_kv_heads
    fields = {k: v for k, v in hf.to_dict().items() if k != "architectures"}
    assert load_config({**fields, "model_type": "falcon"}).num_key_value_heads == expected == 1
