"""SGLang's pool, checked against a transcription of its code from the raw config fields
and against start-up lines SGLang printed.

The ``sglang_*`` helpers transcribe sgl-project/sglang without kvlib's config reader:
- ``get_cell_size_per_token`` (model_runner_kv_cache_mixin.py, commit 226149ac457b):
  ``get_num_kv_heads(tp) * (head_dim + v_head_dim) * layers * element size``, or
  ``(kv_lora_rank + qk_rope_head_dim) * layers * element size`` for MLA;
- ``init_memory_pool``: ``max_total_num_tokens // page_size * page_size``;
- ``MHATokenToKVPool`` / ``MLATokenToKVPool`` (memory_pool.py): buffers of ``size +
  page_size`` slots per layer, logged in units of ``GB = 1024 ** 3``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlib.paging.sglang_pool as sg
from kvlib.config import load_config

CONFIGS = Path(sg.__file__).resolve().parents[1] / "data" / "configs"
ELEMENT = {"bf16": 2, "fp8": 1}


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data.get("text_config", data)


def sglang_cell(config: dict[str, Any], dtype: str, tp: int) -> int:
    layers = config.get("num_hidden_layers") or config["n_layer"]
    if "kv_lora_rank" in config:
        return (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * layers * ELEMENT[dtype]
    heads = config.get("num_attention_heads") or config["n_head"]
    hidden = config.get("hidden_size") or config["n_embd"]
    kv_heads = config.get("num_key_value_heads") or (1 if config.get("multi_query") else heads)
    head_dim = config.get("head_dim") or hidden // heads
    return max(1, kv_heads // tp) * (head_dim + head_dim) * layers * ELEMENT[dtype]


SUPPORTED = ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-4B", "Qwen3-8B", "Mixtral-8x7B",
             "Falcon-7B", "GPT-2", "DeepSeek-LLM-67B", "DeepSeek-V2", "DeepSeek-V3"]


def test_exports() -> None:
    assert sorted(sg.__all__) == sorted(
        ["DEFAULT_PAGE_SIZE", "GB", "SGLANG_COMMIT", "SGLangPool", "cell_size_bytes",
         "default_mem_fraction_static", "max_total_num_tokens", "rest_memory_bytes",
         "sglang_pool"]
    )
    assert sg.GB == 2**30 and sg.DEFAULT_PAGE_SIZE == 1


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_cell_size_is_sglangs_on_every_supported_config(name: str, dtype: str, tp: int) -> None:
    """MHA (GPT-2), GQA, MQA (Falcon-7B) and MLA; an MLA latent is not split by TP."""
    assert sg.cell_size_bytes(load_config(name), dtype, tp) == sglang_cell(raw(name), dtype, tp)


def test_the_latent_is_replicated_and_kv_heads_are_split() -> None:
    v3 = load_config("DeepSeek-V3")
    assert sg.cell_size_bytes(v3, "bf16", 8) == sg.cell_size_bytes(v3, "bf16", 1) == 576 * 61 * 2
    llama = load_config("Llama-3.1-8B")
    assert sg.cell_size_bytes(llama, "bf16", 1) == 8 * sg.cell_size_bytes(llama, "bf16", 8)


@pytest.mark.parametrize(
    ("name", "dtype", "tokens", "tp", "line"),
    [
        # SGLang logs of a DeepSeek-V3 deployment (fp8 KV) and of Kimi K2.5 (TP 8, bf16),
        # whose 61 layers cache the same 512 + 64 latent as DeepSeek-V3.
        ("DeepSeek-V3", "fp8", 524_288, 1, "#tokens: 524288, KV size: 17.16 GB"),
        ("DeepSeek-V3", "bf16", 2_454_421, 8, "#tokens: 2454421, KV size: 160.63 GB"),
    ],
)
def test_the_logged_sizes_count_a_padding_page(
    name: str, dtype: str, tokens: int, tp: int, line: str
) -> None:
    cfg = load_config(name)
    cell = sglang_cell(raw(name), dtype, tp)
    for rest in (tokens * cell, (tokens + 1) * cell - 1):  # every memory giving that count
        pool = sg.sglang_pool(cfg, rest, kv_dtype=dtype, tp=tp)
        assert pool.max_total_num_tokens == tokens
        assert pool.startup_lines == (f"KV Cache is allocated. {line}",
                                      f"max_total_num_tokens={tokens}")
        assert pool.kv_size_bytes == (tokens + 1) * cell and pool.k_size_bytes is None


def test_an_mha_pool_logs_k_and_v() -> None:
    """An SGLang log of Qwen2.5-0.5B (24 layers, 2 KV heads of 64): 20,480 tokens, K and V
    0.12 GB each."""
    cfg = load_config({"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
                       "num_attention_heads": 14, "num_key_value_heads": 2})
    pool = sg.sglang_pool(cfg, 20_480 * 24 * 2 * 2 * 64 * 2)
    assert pool.startup_lines[0] == (
        "KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB"
    )
    assert pool.k_size_bytes == pool.v_size_bytes == 20_481 * 24 * 2 * 64 * 2
    assert pool.kv_size_bytes is None


@pytest.mark.parametrize("page", [1, 16, 64])
def test_the_count_is_rounded_down_to_a_page(page: int) -> None:
    cell = 131_072
    rest = 1_000 * cell + cell // 2
    assert sg.max_total_num_tokens(rest, cell, page) == 1_000 // page * page
    assert sg.max_total_num_tokens(-5, cell, page) == 0


@pytest.mark.parametrize(
    ("gpu_mib", "tp", "chunked", "graph_bs"),
    [(15_360, 1, 2048, 8), (24_576, 1, 2048, 24), (24_576, 4, 2048, 80),
     (46_068, 1, 4096, 32), (46_068, 8, 4096, 160), (81_559, 1, 8192, 256),
     (81_559, 8, 8192, 512), (143_771, 1, 8192, 256), (183_359, 8, 16384, 512)],
)
def test_the_default_fraction_follows_sglangs_heuristic(
    gpu_mib: int, tp: int, chunked: int, graph_bs: int
) -> None:
    """_handle_gpu_memory_settings: reserved MiB for activations, graphs and TP; at least
    10 GiB above 60 GiB of memory."""
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    expected = round((gpu_mib - reserved) / gpu_mib, 3)
    assert sg.default_mem_fraction_static(gpu_mib * 2**20, tp) == expected
    assert 0.75 < expected < 0.95


def test_rest_memory_is_the_fraction_less_the_weights() -> None:
    assert sg.rest_memory_bytes(80 * 2**30, 16 * 2**30, 0.85) == int(0.85 * 80 * 2**30) - 16 * 2**30
    with pytest.raises(ValueError, match="mem_fraction_static"):
        sg.rest_memory_bytes(80 * 2**30, 0, 1.0)


@pytest.mark.parametrize(
    ("config", "reason"),
    [("Gemma-2-9B", "windowed layers"), ("gpt-oss-20b", "windowed layers"),
     ("Mistral-7B-v0.1", "windowed layers")],
)
def test_what_sglang_pages_otherwise_is_refused_with_the_reason(config: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        sg.cell_size_bytes(load_config(config))


def test_mamba_state_and_other_dtypes_are_refused() -> None:
    hybrid = load_config(
        {"model_type": "qwen3_next", "hidden_size": 256, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 1000, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32,
         "linear_value_head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    )
    with pytest.raises(ValueError, match="handle_max_mamba_cache"):
        sg.cell_size_bytes(hybrid)
    with pytest.raises(ValueError, match="fp8_e4m3"):
        sg.cell_size_bytes(load_config("Llama-3.1-8B"), "int4")
