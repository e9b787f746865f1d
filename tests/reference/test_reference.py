"""kvlib's cache sizes against the caches Hugging Face transformers really allocates.

Each model is built from a real config with random weights (see ``refmodels``), run
over a prompt with ``use_cache=True``, and the bytes of every cached key and value
tensor are summed. kvlib must give the same number to the byte, per layer and in
total, below and above every sliding window, at fp32 and bf16.

For MLA (DeepSeek) transformers 5.23.0 caches the compressed latent, the same layout
vLLM pages; the decompressed per-head keys and values (what transformers 4.x cached)
are measured from ``expand_kv`` and compared with ``mla_layout="decompressed"``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import refmodels
import torch
import transformers

from kvlib import sizing
from kvlib.config import ModelConfig, bundled_config_path, bundled_models, load_config

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("one_torch_thread")]

PROMPT_TOKENS = 11  # below every bundled window (the smallest is gpt-oss's 128)
DECODE_TOKENS = 2
DTYPES = ("fp32", "bf16")
SLIDING_MODELS = ("Gemma-2-9B", "Mistral-7B-v0.1", "gpt-oss-20b")
SMALL_WINDOW = 16  # for full-depth runs past the window of models whose real one is 4096


@pytest.fixture(autouse=True, scope="module")
def _free_models() -> Iterator[None]:
    yield
    built.cache_clear()  # the models are not needed past this module


def real_config(name: str) -> dict[str, Any]:
    """The bundled config.json of ``name``, as shipped in kvlib."""
    data: dict[str, Any] = json.loads(bundled_config_path(name).read_text(encoding="utf-8"))
    return data


# How each test model is derived from a bundled config (see variant_config).
SMALL = "small"  # refmodels.shrink: same cache as the real model (MLA: its latent)
SMALL_DECOMPRESSED = "small-decompressed"  # MLA only: same decompressed K/V as the real model
DEEP_SMALL_WINDOW = "deep-small-window"  # SMALL with the window set to SMALL_WINDOW
SHALLOW = "shallow"  # SMALL cut to two layers and one head, real window
LAYOUT_OF = {SMALL: "latent", SMALL_DECOMPRESSED: "decompressed"}


def shrink_variants(name: str) -> tuple[str, ...]:
    """MLA models are shrunk two ways, one per cache layout; others one way."""
    if "kv_lora_rank" in real_config(name):
        return (SMALL, SMALL_DECOMPRESSED)
    return (SMALL,)


@functools.cache
def built(name: str, variant: str, dtype: str) -> transformers.PreTrainedModel:
    """A model for a bundled config and one of the variants above, built once per run."""
    return refmodels.build_model(variant_config(name, variant), dtype)


def variant_config(name: str, variant: str) -> dict[str, Any]:
    if variant in LAYOUT_OF:
        return refmodels.shrink(real_config(name), mla_layout=LAYOUT_OF[variant])
    shrunk = refmodels.shrink(real_config(name))
    if variant == DEEP_SMALL_WINDOW:
        return refmodels.with_window(shrunk, SMALL_WINDOW)
    if variant == SHALLOW:
        return refmodels.reduce_depth(shrunk, 2)
    raise ValueError(variant)


def kvlib_config(config: Mapping[str, Any]) -> ModelConfig:
    return load_config(config)


def assert_matches(
    measured: refmodels.CacheBytes,
    cfg: ModelConfig,
    tokens: int,
    dtype: str,
    *,
    batch: int = 1,
) -> None:
    """Per-layer and total bytes, the sliding layers, and the element type all agree."""
    expected_layers = [batch * b for b in sizing.kv_bytes_by_layer(cfg, tokens, dtype)]
    assert list(measured.layer_bytes) == expected_layers
    assert measured.total_bytes == sizing.kv_bytes(cfg, tokens, dtype, batch=batch)
    assert measured.sliding == tuple(kind == "sliding" for kind in cfg.layer_kinds)
    assert measured.dtypes == {refmodels.TORCH_DTYPES[dtype]}


def test_transformers_is_the_pinned_release() -> None:
    """The cache layouts measured here are those of one release (MLA changed in 5.x)."""
    assert transformers.__version__ == refmodels.TRANSFORMERS_VERSION
    requirements = Path(__file__).resolve().parents[2] / "requirements.txt"
    pins = requirements.read_text(encoding="utf-8").split()
    assert f"transformers=={refmodels.TRANSFORMERS_VERSION}" in pins


def test_every_bundled_model_is_covered() -> None:
    assert set(SLIDING_MODELS) <= set(bundled_models())
    for name in bundled_models():
        kinds = load_config(name).layer_kinds
        assert ("sliding" in kinds) == (name in SLIDING_MODELS), name


@pytest.mark.parametrize(
    ("name", "variant"),
    [(name, v) for name in bundled_models() for v in shrink_variants(name)],
)
def test_shrinking_keeps_the_cache(name: str, variant: str) -> None:
    """kvlib gives the shrunk model exactly the real model's cache, so a match on one is
    a match on the other."""
    real = load_config(name)
    small = kvlib_config(variant_config(name, variant))
    assert small.layer_kinds == real.layer_kinds
    assert small.sliding_window == real.sliding_window
    layout = LAYOUT_OF[variant]
    for dtype in DTYPES:
        for tokens in (1, PROMPT_TOKENS, 100_000):
            assert sizing.kv_bytes_by_layer(
                small, tokens, dtype, mla_layout=layout
            ) == sizing.kv_bytes_by_layer(real, tokens, dtype, mla_layout=layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", bundled_models())
def test_cache_below_window(name: str, dtype: str) -> None:
    """Full depth, a prompt below every window, then two decode steps."""
    model = built(name, SMALL, dtype)
    small = kvlib_config(variant_config(name, SMALL))
    real = load_config(name)
    after_prompt = refmodels.measure(model, PROMPT_TOKENS)
    assert after_prompt.layer_tokens == (PROMPT_TOKENS,) * real.num_hidden_layers
    assert_matches(after_prompt, small, PROMPT_TOKENS, dtype)
    assert after_prompt.total_bytes == sizing.kv_bytes(real, PROMPT_TOKENS, dtype)

    total = PROMPT_TOKENS + DECODE_TOKENS
    after_decode = refmodels.measure(model, PROMPT_TOKENS, decode_tokens=DECODE_TOKENS)
    assert_matches(after_decode, small, total, dtype)
    assert after_decode.total_bytes == sizing.kv_bytes(real, total, dtype)
    growth = after_decode.total_bytes - after_prompt.total_bytes
    assert growth == DECODE_TOKENS * sizing.kv_bytes_per_token(real, dtype)


def _window_points(window: int) -> list[tuple[int, int]]:
    """(prompt, decode steps) pairs at the cap: W - 1 kept, W trimmed, and the cap
    crossed while decoding (prefills at W = 4096 cost seconds each, so three)."""
    return [(window - 1, 0), (window, 0), (window - 2, 3)]


@pytest.mark.parametrize("name", SLIDING_MODELS)
def test_sliding_cap_at_the_real_window(name: str) -> None:
    """The real window, prompts on both sides of it, on a two-layer one-head model."""
    config = variant_config(name, SHALLOW)
    cfg = kvlib_config(config)
    assert cfg.sliding_window == load_config(name).sliding_window
    assert "sliding" in cfg.layer_kinds
    model = built(name, SHALLOW, "fp32")
    for prompt, steps in _window_points(cfg.sliding_window):
        measured = refmodels.measure(model, prompt, decode_tokens=steps)
        assert_matches(measured, cfg, prompt + steps, "fp32")


@pytest.mark.parametrize("name", SLIDING_MODELS)
def test_sliding_cap_at_full_depth(name: str) -> None:
    """Every layer past the window: the real one where cheap (gpt-oss, 128), else 16."""
    real = load_config(name)
    cheap = real.sliding_window is not None and real.sliding_window <= 128
    variant = SMALL if cheap else DEEP_SMALL_WINDOW
    cfg = kvlib_config(variant_config(name, variant))
    assert cfg.sliding_window is not None
    model = built(name, variant, "fp32")
    for prompt, steps in ((cfg.sliding_window + 40, 0), (cfg.sliding_window - 1, 2)):
        measured = refmodels.measure(model, prompt, decode_tokens=steps)
        assert_matches(measured, cfg, prompt + steps, "fp32")
        if variant == SMALL:
            assert measured.total_bytes == sizing.kv_bytes(real, prompt + steps, "fp32")


@pytest.mark.parametrize(("name", "tokens"), [("Llama-3.1-8B", 9), ("gpt-oss-20b", 150)])
def test_batch_multiplies_every_layer(name: str, tokens: int) -> None:
    model = built(name, SMALL, "fp32")
    measured = refmodels.measure(model, tokens, batch=3)
    assert_matches(measured, kvlib_config(variant_config(name, SMALL)), tokens, "fp32", batch=3)
    assert measured.total_bytes == sizing.kv_bytes(load_config(name), tokens, "fp32", batch=3)


# --- MLA: latent (transformers 5.x, vLLM) and decompressed (transformers 4.x) layouts ---


def vllm_mla_page_bytes(config: Mapping[str, Any], block_tokens: int, dtype_bytes: int) -> int:
    """vLLM's MLA page: ``block_size * num_kv_heads * head_size * dtype_size``, no factor 2.

    vllm-project/vllm, vllm/v1/kv_cache_interface.py, MLAAttentionSpec.real_page_size_bytes;
    with ``num_kv_heads`` 1 and ``head_size = kv_lora_rank + qk_rope_head_dim``
    (vllm/config/model.py, ModelConfig.get_num_kv_heads and get_head_size when use_mla).
    """
    head_size = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    return block_tokens * 1 * head_size * dtype_bytes


def vllm_attention_page_bytes(
    num_kv_heads: int, head_dim: int, block_tokens: int, dtype_bytes: int
) -> int:
    """vLLM's full-attention page: ``2 * block_size * num_kv_heads * head_size * dtype_size``.

    vllm-project/vllm, vllm/v1/kv_cache_interface.py, AttentionSpec.real_page_size_bytes.
    """
    return 2 * block_tokens * num_kv_heads * head_dim * dtype_bytes


@pytest.mark.parametrize(("dtype", "dtype_bytes"), [("bf16", 2), ("fp8", 1), ("fp32", 4)])
def test_mla_latent_is_the_vllm_page(dtype: str, dtype_bytes: int) -> None:
    raw = real_config("DeepSeek-V3")
    cfg = load_config("DeepSeek-V3")
    pages, block = 7, 16
    page = vllm_mla_page_bytes(raw, block, dtype_bytes)
    assert sizing.kv_bytes(cfg, pages * block, dtype) == raw["num_hidden_layers"] * pages * page
    assert sizing.kv_bytes_per_token(cfg, dtype) == raw["num_hidden_layers"] * page // block


def test_full_attention_is_the_vllm_page() -> None:
    raw = real_config("Llama-3.1-8B")
    head_dim = raw["hidden_size"] // raw["num_attention_heads"]
    page = vllm_attention_page_bytes(raw["num_key_value_heads"], head_dim, 16, 2)
    assert sizing.kv_bytes(load_config("Llama-3.1-8B"), 16 * 5, "bf16") == (
        raw["num_hidden_layers"] * 5 * page
    )


def test_transformers_caches_the_vllm_latent() -> None:
    """Independent of kvlib: transformers' DeepSeek cache is vLLM's MLA page, byte for byte."""
    raw = real_config("DeepSeek-V3")
    measured = refmodels.measure(built("DeepSeek-V3", SMALL, "bf16"), 16)
    assert measured.layer_bytes == (vllm_mla_page_bytes(raw, 16, 2),) * raw["num_hidden_layers"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_decompressed_matches_expand_kv(dtype: str) -> None:
    """Per-head keys (qk_nope + qk_rope) and values (v_head_dim) for all 128 heads."""
    model = built("DeepSeek-V3", SMALL_DECOMPRESSED, dtype)
    small = kvlib_config(variant_config("DeepSeek-V3", SMALL_DECOMPRESSED))
    cache = refmodels.prefill_and_decode(model, PROMPT_TOKENS, decode_tokens=DECODE_TOKENS)
    tokens = PROMPT_TOKENS + DECODE_TOKENS
    latent = refmodels.cache_bytes(cache)
    assert_matches(latent, small, tokens, dtype)
    decompressed = refmodels.decompressed_mla_bytes(model, cache)
    assert decompressed == sizing.kv_bytes_by_layer(small, tokens, dtype, mla_layout="decompressed")
    real = load_config("DeepSeek-V3")
    assert sum(decompressed) == sizing.kv_bytes(real, tokens, dtype, mla_layout="decompressed")


def test_mla_ignores_num_key_value_heads() -> None:
    """MLA's latent is one shared head: the config's num_key_value_heads never reaches
    the cache (DeepseekV3Attention views the latent as a single head)."""
    raw = real_config("DeepSeek-V3")
    reference = load_config(raw)
    for kv_heads in (1, 8, 128):
        cfg = load_config({**raw, "num_key_value_heads": kv_heads})
        for layout in ("latent", "decompressed"):
            assert sizing.kv_bytes(cfg, 1000, "bf16", mla_layout=layout) == sizing.kv_bytes(
                reference, 1000, "bf16", mla_layout=layout
            )


# --- Real-world layouts that are not bundled, as dict configs ---

_TINY = {"vocab_size": 128, "intermediate_size": 32}

EXTRA_CONFIGS: dict[str, dict[str, Any]] = {
    # Gemma 3: text fields nested under text_config, 5 sliding layers then 1 full.
    "gemma3-nested-pattern": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "num_hidden_layers": 8,
            "sliding_window": SMALL_WINDOW,
            "sliding_window_pattern": 6,
            "vocab_size": 300,
            "intermediate_size": 32,
        },
        "vision_config": refmodels.TINY_VISION_CONFIG,
        "mm_tokens_per_image": 4,
        "boi_token_index": 297,
        "eoi_token_index": 298,
        "image_token_index": 299,
    },
    # Qwen2: use_sliding_window with max_window_layers; the later layers slide.
    "qwen2-max-window-layers": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 5,
        "use_sliding_window": True,
        "sliding_window": SMALL_WINDOW,
        "max_window_layers": 2,
        **_TINY,
    },
    # Multi-query attention (SantaCoder / StarCoder): one KV head.
    "gpt-bigcode-multi-query": {
        "model_type": "gpt_bigcode",
        "n_embd": 128,
        "n_head": 4,
        "n_layer": 3,
        "multi_query": True,
        "n_inner": 32,
        "vocab_size": 128,
    },
    # Qwen3-0.6B layout: head_dim 128 while hidden_size / heads is 64.
    "qwen3-explicit-head-dim": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 2,
        **_TINY,
    },
    # Llama-2 style: no num_key_value_heads field means one KV head per query head.
    "llama-mha-default-kv-heads": {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        **_TINY,
    },
    # DeepSeek-V2-Lite layout: MLA without a query LoRA (q_lora_rank null).
    "deepseek-v2-no-q-lora": {
        "model_type": "deepseek_v2",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        **_TINY,
    },
    # Phi-3-mini layout: a window and no layer_types, so every layer slides.
    "phi3-every-layer-slides": {
        "model_type": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "sliding_window": SMALL_WINDOW,
        "pad_token_id": None,
        **_TINY,
    },
    # Cohere2 (Command R7B): default pattern of three sliding layers then one full.
    "cohere2-default-pattern": {
        "model_type": "cohere2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 5,
        "sliding_window": SMALL_WINDOW,
        **_TINY,
    },
    # Gemma 3 text with an explicit layer_types list that breaks the default pattern.
    "gemma3-explicit-layer-types": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 4,
        "sliding_window": SMALL_WINDOW,
        "layer_types": [
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        **_TINY,
    },
    # Bidirectional Gemma 3 (EmbeddingGemma): Gemma3TextConfig turns W into W // 2 + 1.
    "gemma3-bidirectional-window": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 7,
        "sliding_window": SMALL_WINDOW,
        "use_bidirectional_attention": True,
        **_TINY,
    },
    # Mixtral / Mistral with "sliding_window": null: full attention everywhere.
    "mistral-null-window": {
        "model_type": "mistral",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "sliding_window": None,
        **_TINY,
    },
}

# Falcon-40B layout: new_decoder_architecture with grouped KV heads.
FALCON_NEW_ARCH = {
    "model_type": "falcon",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "num_hidden_layers": 2,
    "new_decoder_architecture": True,
    "ffn_hidden_size": 32,
    "vocab_size": 128,
}


def test_falcon_new_architecture_is_sized_as_serving_engines_cache_it() -> None:
    """transformers copies Falcon-40B's 8 KV heads out to all query heads before caching
    (FalconAttention.forward: ``num_kv_heads = self.num_heads if new_decoder_architecture``);
    vLLM caches ``num_kv_heads`` (vllm/config/model.py, get_total_num_kv_heads). kvlib
    follows the serving engine, so transformers holds exactly heads / kv_heads times more."""
    cfg = load_config(FALCON_NEW_ARCH)
    assert cfg.num_key_value_heads == 2
    model = refmodels.build_model(FALCON_NEW_ARCH, "fp32")
    tokens = 11
    measured = refmodels.measure(model, tokens)
    head_dim = 256 // 4
    assert sizing.kv_bytes(cfg, tokens, "fp32") == 2 * 2 * 2 * head_dim * 4 * tokens
    assert measured.total_bytes == sizing.kv_bytes(cfg, tokens, "fp32") * 4 // 2


@pytest.mark.parametrize("key", sorted(EXTRA_CONFIGS))
def test_cache_of_other_layouts(key: str) -> None:
    config = EXTRA_CONFIGS[key]
    cfg = load_config(config)
    model = refmodels.build_model(config, "fp32")
    for prompt, steps in ((SMALL_WINDOW - 5, 0), (SMALL_WINDOW + 24, 2)):
        measured = refmodels.measure(model, prompt, decode_tokens=steps)
        assert_matches(measured, cfg, prompt + steps, "fp32")


def test_layouts_cover_every_kind() -> None:
    """The dict configs exercise sliding layers and MLA, not only full attention."""
    kinds = {kind for c in EXTRA_CONFIGS.values() for kind in load_config(c).layer_kinds}
    assert kinds == {"full", "sliding", "mla"}


def test_nbytes_counts_the_sliding_view_not_its_storage() -> None:
    """After a prompt longer than the window, a sliding layer exposes W - 1 tokens while
    the concatenated prompt is still allocated underneath until the next step; kvlib
    sizes the steady state, which is what the tensors expose."""
    model = built("gpt-oss-20b", SHALLOW, "fp32")
    window = load_config("gpt-oss-20b").sliding_window
    assert window is not None
    cache = refmodels.prefill_and_decode(model, window + 50)
    sliding = cache.layers[0]
    assert sliding.keys.shape[-2] == window - 1
    assert sliding.keys.untyped_storage().nbytes() > sliding.keys.nbytes
    stepped = refmodels.prefill_and_decode(model, window + 50, decode_tokens=1).layers[0]
    per_token = stepped.keys.nbytes // (window - 1)
    assert stepped.keys.untyped_storage().nbytes() == window * per_token


def test_measurement_sees_the_dtype() -> None:
    """The harness would notice a cache kept in another dtype than the model's."""
    fp32 = refmodels.measure(built("Llama-3.1-8B", SMALL, "fp32"), 5)
    bf16 = refmodels.measure(built("Llama-3.1-8B", SMALL, "bf16"), 5)
    assert fp32.total_bytes == 2 * bf16.total_bytes
    assert fp32.dtypes == {torch.float32}
    assert bf16.dtypes == {torch.bfloat16}
